import Foundation
import RelayCore
import RelayDelivery
import RelayTestSupport
import Synchronization
import Testing

/// The order of one subscription's webhooks at the receiver: one endpoint gets a subscription's
/// deliveries one at a time, in log order, while different subscriptions go out concurrently.
@Suite struct DeliveryOrderTests {
    /// What a receiver saw: each request's subject and event id in arrival order, and how many of one
    /// subject were in its hands at once.
    final class Arrivals: Sendable {
        private struct State {
            var order: [(subject: String, event: String)] = []
            var active: [String: Int] = [:]
            var mostAtOnce: [String: Int] = [:]
            var subjectsAtOnce = 0
        }

        private let state = Mutex(State())

        func arrive(_ request: TestHTTPRequest) -> String {
            let data = (try? JSON.parse(request.body))?["data"]
            let subject = data?["originalTransactionId"]?.stringValue ?? "?"
            let event = data?["id"]?.stringValue ?? "?"
            state.withLock { state in
                state.order.append((subject, event))
                state.active[subject, default: 0] += 1
                state.mostAtOnce[subject] = max(state.mostAtOnce[subject] ?? 0, state.active[subject] ?? 0)
                state.subjectsAtOnce = max(state.subjectsAtOnce, state.active.values.filter { $0 > 0 }.count)
            }
            return subject
        }

        func leave(_ subject: String) { state.withLock { $0.active[subject, default: 1] -= 1 } }

        var subjectsAtOnce: Int { state.withLock { $0.subjectsAtOnce } }
        var mostAtOnce: [String: Int] { state.withLock { $0.mostAtOnce } }
        func events(of subject: String) -> [String] { state.withLock { $0.order.filter { $0.subject == subject }.map(\.event) } }
        var count: Int { state.withLock { $0.order.count } }
    }

    static func body(subject: String, event: String) -> String {
        #"{"object":"event","type":"renewal","data":{"id":"\#(event)","name":"renewal","originalTransactionId":"\#(subject)"}}"#
    }

    /// A backlog released at once (the deliverer starts after everything was written, as when a
    /// partition resumes after a rebalance): every subscription's webhooks arrive in log order, never two
    /// of one at a time; and the subscriptions' first deliveries are in the receiver's hands together,
    /// which the receiver requires before it answers any of them.
    @Test func aSubscriptionsBacklogArrivesInOrderWhileSubscriptionsGoOutTogether() async throws {
        let arrivals = Arrivals()
        let subjects = (0..<5).map { "sub_order_\($0)" }
        let allFive = Eventual<Void>()
        let receiver = try await TestHTTPServer { request in
            let subject = arrivals.arrive(request)
            // The first answers wait until five subscriptions are in flight at once: with deliveries
            // serialized across subscriptions this never happens, and the test times out.
            if arrivals.subjectsAtOnce >= subjects.count { allFive.set(()) }
            await allFive.value()
            arrivals.leave(subject)
            return TestHTTPResponse(status: 200)
        }
        let harness = try DeliveryHarness(endpoints: [("ordered", receiver.baseURL + "/hook")], perEndpoint: 64)
        for index in 0..<6 {
            for subject in subjects {
                try await harness.send(
                    endpoint: "ordered", eventID: "stripe:evt_\(subject)_\(index):renewal", subject: "stripe:\(subject)",
                    body: Self.body(subject: subject, event: "stripe:evt_\(subject)_\(index):renewal"))
            }
        }
        try harness.start()
        try await waitUntil("30 deliveries", timeout: .seconds(30)) { arrivals.count >= 30 }
        for subject in subjects {
            #expect(arrivals.events(of: subject) == (0..<6).map { "stripe:evt_\(subject)_\($0):renewal" }, "\(subject)")
            #expect(arrivals.mostAtOnce[subject] == 1, "\(subject) had \(arrivals.mostAtOnce[subject] ?? 0) deliveries out at once")
        }
        #expect(arrivals.subjectsAtOnce == subjects.count)
        await harness.close()
        await receiver.stop()
    }

    /// The deliveries waiting behind their subscription's first one are checked like any new delivery when
    /// their turn comes: the first one's failure opened the breaker, so they go to the retry topic unsent
    /// instead of each spending an attempt (and a timeout) on an endpoint that is down.
    @Test func waitingDeliveriesMeetTheOpenBreakerWhenTheirTurnComes() async throws {
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: 503) }
        var options = DelivererOptions()
        options.breakerThreshold = 1
        options.breakerCooldown = .seconds(60)
        let harness = try DeliveryHarness(endpoints: [("down", receiver.baseURL + "/hook")], schedule: "[30s]", options: options)
        for index in 0..<3 {
            let event = "stripe:evt_down_\(index):renewal"
            try await harness.send(endpoint: "down", eventID: event, subject: "stripe:sub_down", body: Self.body(subject: "sub_down", event: event))
        }
        let (reader, retried) = try harness.reader(harness.configuration.topics.retry(step: 1))
        try harness.start()
        let records = try await retried.waitFor(count: 3)
        #expect(Set(records.compactMap { $0.header("relay-event-id") }).count == 3)
        #expect(receiver.requests.count == 1, "only the first delivery was attempted; the others met the open breaker")
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    /// A delivery that fails moves to a retry topic, and the subscription's next delivery goes ahead of
    /// it rather than waiting hours for the retry schedule: the documented choice. The receiver can tell
    /// the stale one by `data.sequence` (docs/delivery: ordering).
    @Test func aDeliveryMovedToARetryTopicIsOvertakenByTheNextOne() async throws {
        let arrivals = Arrivals()
        let failedOnce = Atomic<Bool>(false)
        let receiver = try await TestHTTPServer { request in
            let subject = arrivals.arrive(request)
            defer { arrivals.leave(subject) }
            let event = (try? JSON.parse(request.body))?["data"]?["id"]?.stringValue
            if event == "stripe:evt_first:renewal", !failedOnce.exchange(true, ordering: .relaxed) { return TestHTTPResponse(status: 503) }
            return TestHTTPResponse(status: 200)
        }
        let harness = try DeliveryHarness(endpoints: [("retrying", receiver.baseURL + "/hook")], schedule: "[2s]")
        for event in ["stripe:evt_first:renewal", "stripe:evt_second:renewal"] {
            try await harness.send(endpoint: "retrying", eventID: event, subject: "stripe:sub_retry", body: Self.body(subject: "sub_retry", event: event))
        }
        try harness.start()
        try await waitUntil("the retried delivery", timeout: .seconds(30)) { arrivals.count >= 3 }
        // The first attempt failed; the second delivery did not wait for the first one's retry.
        #expect(arrivals.events(of: "sub_retry") == ["stripe:evt_first:renewal", "stripe:evt_second:renewal", "stripe:evt_first:renewal"])
        #expect(arrivals.mostAtOnce["sub_retry"] == 1)
        await harness.close()
        await receiver.stop()
    }
}
