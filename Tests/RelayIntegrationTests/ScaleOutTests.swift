import Foundation
import Glibc
import RelayConfig
import RelayCore
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// Scaled out as a platform team runs it: two deliverer processes in one consumer group on the
/// Kafka-protocol mock broker (real TCP on loopback), one of them SIGKILLed while it holds partitions.
@Suite struct ScaleOutTests {
    @Test func twoDeliverersOneKilledLoseNothingAndKeepEachSubscriptionInOrder() async throws {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: testLogger("mock-cluster"))
        // First arrivals per subscription, in order; every arrival's webhook-id.
        let firstArrivals = LockedBox<[String: [Int]]>([:])
        let seen = LockedBox<Set<String>>([])
        let receiver = try await TestHTTPServer { request in
            let data = (try? JSON.parse(request.body))?["data"]
            if let subject = data?["originalTransactionId"]?.stringValue, let index = data?["index"]?.int64Value,
                let id = request.headers["webhook-id"]
            {
                let first = seen.withLock { $0.insert(id).inserted }
                if first { firstArrivals.withLock { $0[subject, default: []].append(Int(index)) } }
            }
            // A receiver that takes a moment, so the killed process still has deliveries under way.
            try? await Task.sleep(for: .milliseconds(100))
            return TestHTTPResponse(status: 200)
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-scale-out"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        try Data(
            """
            log: { kind: kafka }
            kafka: { properties: { fetch.wait.max.ms: "5", session.timeout.ms: "6000", heartbeat.interval.ms: "500" } }
            ingest: { listen: "127.0.0.1:0" }
            apps: [{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_test"] } }]
            endpoints: [{ id: hooks, app: demo, url: "\(receiver.baseURL)/hooks", secrets: ["\(ShutdownTests.secret)"], events: ["*"] }]
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 5s
            """.utf8
        ).write(to: file)
        let configuration = try RelayConfiguration.load(path: file.path, environment: [:])
        for topic in configuration.topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
            try cluster.createTopic(topic, partitions: 4)
        }
        let arguments = ["run", "--config", file.path, "--role", "deliverer", "--bootstrap-servers", cluster.bootstrapServers]
        let first = try startChildProcess(executable, arguments)
        defer { first.killIfRunning() }
        let second = try startChildProcess(executable, arguments)
        defer { second.killIfRunning() }
        for child in [first, second] {
            guard await child.stderr(contains: "partitions assigned", within: .seconds(60)) else {
                Issue.record("a deliverer did not join its group: \(await child.result().stderr.suffix(2000))")
                return
            }
        }

        // 40 subscriptions of 10 webhooks each, written in order per subscription.
        let subjects = (0..<40).map { "sub_scale_\($0)" }
        let log = KafkaRecordLog(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), logger: testLogger())
        let producer = try log.producer
        for index in 0..<10 {
            for subject in subjects {
                let id = "stripe:evt_\(subject)_\(index):renewal"
                let body = #"{"object":"event","type":"renewal","data":{"id":"\#(id)","index":\#(index),"originalTransactionId":"\#(subject)"}}"#
                _ = try await producer.produce(
                    DeliveryRecord.fresh(
                        topic: configuration.topics.deliveries, endpoint: "hooks", subject: "stripe:\(subject)", body: Array(body.utf8), eventID: id,
                        eventType: "renewal", app: "demo"))
            }
        }
        await log.close()
        // Killed while it holds partitions and has deliveries to make.
        try await waitUntil("the first webhooks", timeout: .seconds(60)) { seen.value.count >= 40 }
        first.signal(SIGKILL)
        _ = await first.result()

        // The survivor takes the partitions over once the dead member's session expires.
        try await waitUntil("every webhook delivered", timeout: .seconds(90)) { seen.value.count >= 400 }
        #expect(seen.value.count == 400)
        let arrivals = firstArrivals.value
        for subject in subjects {
            #expect(arrivals[subject] == Array(0..<10), "\(subject) arrived as \(arrivals[subject] ?? [])")
        }
        second.signal(SIGTERM)
        #expect(await second.result().status == 0)
        await receiver.stop()
    }
}
