import Foundation
import Logging
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayStripe
import RelayTestSupport
import Testing

/// The run loop every history command shares (`HistoryLoop`) and the `Retry-After` the store clients read:
/// a failing store is waited out by the pacing (longer when the store asks), a refusal is not, and a
/// store that asks for more than the pacing allows ends the run at once.
@Suite struct HistoryLoopTests {
    /// A loop whose waits are recorded, not slept.
    static func loop(waits: [Duration] = [.seconds(5), .seconds(15)], maximum: Duration = .seconds(600)) -> (HistoryLoop, LockedBox<[Duration]>, LockedBox<[String]>) {
        let slept = LockedBox<[Duration]>([])
        let lines = LockedBox<[String]>([])
        let loop = HistoryLoop(pacing: HistoryLoop.Pacing(waits: waits, maximumRetryAfter: maximum) { wait in slept.withLock { $0.append(wait) } }) { line in
            lines.withLock { $0.append(line) }
        }
        return (loop, slept, lines)
    }

    static func unavailable(retryAfter: Duration? = nil, status: Int = 429) -> StoreAPIError {
        var error = StoreAPIError(.stripe, kind: .unavailable, message: "rate limited", status: status)
        error.retryAfter = retryAfter
        return error
    }

    @Test func aFailingCallIsWaitedOutByThePacingOrTheStoresLongerRetryAfter() async throws {
        let (loop, slept, lines) = Self.loop()
        let calls = LockedBox(0)
        let answer = try await loop.call("a page") { () async throws(StoreAPIError) -> String in
            let call = calls.withLock { count -> Int in
                count += 1
                return count
            }
            // First: a 429 asking for 60 s (longer than the pacing's 5 s); then a 503 without Retry-After.
            if call == 1 { throw Self.unavailable(retryAfter: .seconds(60)) }
            if call == 2 { throw Self.unavailable(status: 503) }
            return "page"
        }
        #expect(answer == "page")
        #expect(slept.value == [.seconds(60), .seconds(15)])
        #expect(lines.value.count == 2)
        #expect(lines.value.first?.contains("limits the rate (a page); trying again in 60 s (1 of 2)") == true, "\(lines.value)")
        #expect(lines.value.last?.contains("is unavailable") == true, "\(lines.value)")
    }

    @Test func aRefusalOrATooLongRetryAfterOrSpentWaitsEndTheCall() async throws {
        let (loop, slept, _) = Self.loop(maximum: .seconds(300))
        // A refusal is not waited for.
        await #expect(throws: StoreAPIError.self) {
            try await loop.call("a page") { () async throws(StoreAPIError) -> Int in throw StoreAPIError(.stripe, kind: .rejected, message: "no", status: 403) }
        }
        #expect(slept.value.isEmpty)
        // A store asking for an hour: the run ends now, with the store's ask in the error.
        do {
            _ = try await loop.call("a page") { () async throws(StoreAPIError) -> Int in throw Self.unavailable(retryAfter: .seconds(3600)) }
            Issue.record("the call succeeded")
        } catch {
            #expect(error.retryAfter == .seconds(3600))
        }
        #expect(slept.value.isEmpty)
        // Always failing: tried once more after each wait, then the error.
        let calls = LockedBox(0)
        await #expect(throws: StoreAPIError.self) {
            try await loop.call("a page") { () async throws(StoreAPIError) -> Int in
                calls.withLock { $0 += 1 }
                throw Self.unavailable(status: 503)
            }
        }
        #expect(calls.value == 3)
        #expect(slept.value == [.seconds(5), .seconds(15)])
    }

    @Test func pagesFollowTheCursorAndASpentPageBecomesTheCommandsError() async throws {
        let (loop, _, _) = Self.loop(waits: [])
        var seen: [String] = []
        try await loop.pages("a list") { cursor throws(StoreAPIError) -> (page: String, next: String?) in
            switch cursor {
            case nil: ("a", "1")
            case "1": ("b", "2")
            default: ("c", nil)
            }
        } failure: { error in
            CommandFailure(.unavailable, error.message)
        } each: { page, number throws(CommandFailure) in
            seen.append("\(number):\(page)")
        }
        #expect(seen == ["1:a", "2:b", "3:c"])
        await #expect(throws: CommandFailure.self) {
            try await loop.pages("a list") { _ throws(StoreAPIError) -> (page: String, next: String?) in
                throw Self.unavailable(status: 503)
            } failure: { error in
                CommandFailure(.unavailable, error.message)
            } each: { _, _ throws(CommandFailure) in }
        }
    }

    @Test func aStoreClientWaitsForAShortRetryAfterAndReturnsALongOne() async throws {
        let answers = LockedBox<[Int]>([])
        let server = try await TestHTTPServer { request in
            let retryAfter = answers.withLock { list -> String? in
                list.append(list.count)
                // The first call of each subscription: 429, asking for 1 s (sub_short) or 120 s (sub_long).
                return list.count == 1 ? "1" : list.count == 3 ? "120" : nil
            }
            if let retryAfter { return TestHTTPResponse(status: 429, headers: [("Retry-After", retryAfter)], text: #"{"error": {"type": "rate_limit_error"}}"#) }
            return TestHTTPResponse(text: #"{"id": "sub_short", "object": "subscription"}"#)
        }
        let client = StripeClient(configuration: RelayConfiguration.StripeAPI(baseUrl: server.baseURL, secretKey: "rk_test_x"), logger: Logger(label: "test"))
        let started = ContinuousClock.now
        _ = try await client.subscription("sub_short")
        // Waited for the store's 1 s, not only its own 100 ms.
        #expect(ContinuousClock.now - started >= .milliseconds(950))
        #expect(answers.value.count == 2)
        // 120 s is beyond what a client waits inside a call: the error carries it, after one request.
        do {
            _ = try await client.subscription("sub_long")
            Issue.record("the call succeeded")
        } catch {
            #expect(error.kind == .unavailable)
            #expect(error.retryAfter == .seconds(120))
            #expect(error.message.contains("Retry-After"))
        }
        #expect(answers.value.count == 3)
        await server.stop()
    }
}
