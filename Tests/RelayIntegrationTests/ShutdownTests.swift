import Foundation
import Glibc
import RelayConfig
import RelayCore
import RelayKafka
import RelayHTTPClient
import RelayTestSupport
import Testing

/// SIGTERM while a webhook is in flight to an endpoint that never answers. The process used to wait for
/// the transfer (up to `delivery.timeout`), overrun `shutdownTimeout`, and die with SIGILL
/// ("Cancellation took longer than allowed"). It must exit 0 within `shutdownTimeout`, and the
/// deliveries it aborted must go out after the restart.
@Suite struct ShutdownTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    private func writeConfiguration(_ file: URL, endpoint: String) throws {
        try StripeDemoConfiguration.write(
            to: file, endpoints: [#"id: hooks, app: demo, url: "\#(endpoint)", secrets: ["\#(Self.secret)"], events: ["*"]"#],
            delivery: "timeout: 60s, allowPrivateNetworks: true", shutdownTimeout: "8s")
    }

    @Test func sigtermWithAWebhookInFlightToASlowEndpointExitsZeroInTimeAndRedeliversAfterRestart() async throws {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        // Accepts and never answers; keeps the connections open.
        let held = LockedBox<[Int32]>([])
        let silent = try LoopbackListener { fd in held.withLock { $0.append(fd) } }
        defer {
            silent.close()
            for fd in held.value { close(fd) }
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-shutdown"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        let data = directory.appendingPathComponent("data").path
        try writeConfiguration(file, endpoint: "http://127.0.0.1:\(silent.port)/hooks")

        let first = try startChildProcess(executable, ["dev", "--config", file.path, "--data", data])
        // A failed step never leaves a child running (it would hold the data directory's lock).
        defer { first.killIfRunning() }
        guard let ingestLine = await first.line(startingWith: "ingest: ", within: .seconds(60)) else {
            first.killIfRunning()
            Issue.record("dev did not start: \(await first.result().stderr)")
            return
        }
        let ingest = String(ingestLine.dropFirst("ingest: ".count))
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))
        #expect(try await postSignedStripeSubscription(to: ingest, http: http) == 200)
        try await waitUntil("the webhook transfer reached the endpoint", timeout: .seconds(60)) { silent.connections.load(ordering: .relaxed) > 0 }

        let signalled = ContinuousClock.now
        first.signal(SIGTERM)
        let ended = await first.result()
        let took = ContinuousClock.now - signalled
        #expect(ended.status == 0, "\(ended.stderr.suffix(2000))")
        // dev's ready lines, in the contract's order (programs read the first three as they come).
        #expect(ended.stdoutText.split(separator: "\n").map { $0.prefix { $0 != ":" } } == ["ingest", "backend", "log", "console"], "\(ended.stdoutText)")
        #expect(took < .seconds(8), "shutdown took \(took)")
        #expect(ended.stderr.contains("aborting webhook transfers still running"))

        // Restarted with an endpoint that answers: both events of the aborted deliveries go out.
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: 200) }
        try writeConfiguration(file, endpoint: "\(receiver.baseURL)/hooks")
        let second = try startChildProcess(executable, ["dev", "--config", file.path, "--data", data])
        defer { second.killIfRunning() }
        let restarted = await second.line(startingWith: "ingest: ", within: .seconds(60))
        try #require(restarted != nil, "dev did not restart")
        let ids: Set<String> = ["stripe:evt_shutdown:initial_purchase", "stripe:evt_shutdown:subscription_status_did_change"]
        try await waitUntil("both webhooks delivered after the restart", timeout: .seconds(60)) {
            Set(receiver.requests.compactMap { $0.headers["webhook-id"] }).isSuperset(of: ids)
        }
        #expect(receiver.requests.allSatisfy { StandardWebhooksReceiver.verify($0, secret: Self.secret) })
        second.signal(SIGTERM)
        #expect(await second.result().status == 0)
        await receiver.stop()
    }

    /// SIGTERM while the broker stops answering, so the Kafka consumer can neither commit nor leave its
    /// group. This used to end in the service group's fatal error (SIGILL, "Cancellation took longer
    /// than allowed"). Now the process exits 75 at its own deadline (shutdownTimeout + 5 s), saying what it
    /// abandoned; the partitions' next owner does that work (offsets are stored only after it).
    @Test func sigtermWhileTheBrokerStopsAnsweringExitsAtTheDeadlineWithoutACrash() async throws {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: testLogger("mock-cluster"))
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: 200) }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-stuck-leave"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        try Data(
            """
            log: { kind: kafka }
            kafka: { properties: { fetch.wait.max.ms: "5", auto.commit.interval.ms: "600000" } }
            ingest: { listen: "127.0.0.1:0" }
            apps: [{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_test"] } }]
            endpoints: [{ id: hooks, app: demo, url: "\(receiver.baseURL)/hooks", secrets: ["\(Self.secret)"], events: ["*"] }]
            delivery: { retrySchedule: [5s], allowPrivateNetworks: true }
            shutdownTimeout: 2s
            """.utf8
        ).write(to: file)
        let configuration = try RelayConfiguration.load(path: file.path, environment: [:])
        for topic in configuration.topics.all(retrySteps: 1) { try cluster.createTopic(topic, partitions: 2) }

        let child = try startChildProcess(executable, ["run", "--config", file.path, "--role", "deliverer", "--bootstrap-servers", cluster.bootstrapServers])
        defer { child.killIfRunning() }
        guard await child.stderr(contains: "partitions assigned", within: .seconds(60)) else {
            child.killIfRunning()
            Issue.record("the deliverer did not join its group: \(await child.result().stderr.suffix(2000))")
            return
        }
        // One webhook delivered: its offset is stored and, with auto-commit far off, left for the final
        // commit, which then waits for a broker that no longer answers.
        let log = KafkaRecordLog(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), logger: testLogger())
        _ = try await log.producer.produce(
            DeliveryRecord.fresh(
                topic: configuration.topics.deliveries, endpoint: "hooks", subject: "stripe:sub_stuck", body: Array(#"{"data":{"id":"e1"}}"#.utf8),
                eventID: "stripe:evt_stuck:renewal", eventType: "renewal", app: "demo"))
        try await waitUntil("the webhook delivered", timeout: .seconds(60)) { receiver.requests.count >= 1 }
        await log.close()
        try cluster.setRoundTripTime(600_000)

        let signalled = ContinuousClock.now
        child.signal(SIGTERM)
        let ended = await child.result()
        let took = ContinuousClock.now - signalled
        #expect(ended.status == 75, "\(ended.stderr.suffix(3000))")
        #expect(!ended.stderr.contains("Fatal error"))
        #expect(ended.stderr.contains("shutdown deadline passed"))
        #expect(ended.stderr.contains("Deliverer"), "the log line names what was still stopping")
        // 2 s to stop, 5 s for cancelled services to return, then the exit: well before the broker answers.
        #expect(took >= .seconds(6) && took < .seconds(20), "took \(took)")
        await receiver.stop()
    }

    static func stripeEvent(now: Int64) -> String {
        StripeTestEvent.subscriptionCreated(subscription: "sub_shutdown", event: "evt_shutdown", user: "user-shutdown", start: now)
    }
}
