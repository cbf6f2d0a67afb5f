import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayHistory
import RelayKafka
import RelayTestSupport
import Testing

/// Which log a test relay runs on.
enum TestLog: String, Sendable, CaseIterable, CustomTestStringConvertible {
    /// `dev --kafka`: librdkafka's mock cluster on loopback.
    case kafka
    /// `dev`: the embedded durable log in a fresh data directory.
    case embedded
    var testDescription: String { rawValue }
}

/// A whole relay (the log, ingest, worker, deliverer, local backend) on loopback with port 0, for one test.
final class TestRelay: Sendable {
    let environment: DevEnvironment
    let configuration: RelayConfiguration
    let baseURL: String
    let runTask: Task<Void, any Error>
    let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))

    /// - Parameter ingest: more `ingest` keys, as YAML flow-mapping entries (`idleTimeout: 1s, ...`).
    static func configuration(ackTimeout: String = "10s", maxBodyBytes: Int = 262144, ingest: String = "", extra: String = "") throws
        -> RelayConfiguration
    {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-config"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data(#"{"keys": []}"#.utf8).write(to: directory.appendingPathComponent("jwks.json"))
        let yaml = """
            ingest: { listen: "127.0.0.1:0", maxBodyBytes: \(maxBodyBytes), ackTimeout: \(ackTimeout)\(ingest.isEmpty ? "" : ", " + ingest) }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                apple: { bundleId: com.example.app, environments: [Xcode] }
                google: { packageName: com.example.app, pushAudience: "https://relay.test/google", pushServiceAccount: "push@example.iam.gserviceaccount.com", jwks: jwks.json }
                stripe: { signingSecrets: ["whsec_test"] }
                paddle: { secretKeys: ["pdl_test"] }
                products:
                  - { productId: price_pro, store: STRIPE, entitlements: [pro] }
              - key: stripe-only
                projectId: 1
                applicationId: 2
                stripe: { signingSecrets: ["whsec_test"] }
            endpoints:
              - { id: hooks, app: demo, url: "http://127.0.0.1:9/hooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], events: ["*"] }
              - { id: renewals, app: demo, url: "http://127.0.0.1:9/renewals", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], events: [renewal] }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            \(extra)
            """
        return try RelayConfiguration.parse(yaml: yaml, baseDirectory: directory.path, environment: [:])
    }

    /// The embedded log's data directory (`dev --data`), on the embedded log.
    var dataDirectory: String? { environment.dataDirectory }

    init(configuration: RelayConfiguration, log: TestLog = .kafka) async throws {
        self.configuration = configuration
        let data = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-data")).path
        environment = try DevEnvironment(
            configuration: configuration, dataDirectory: log == .embedded ? data : nil, kafka: log == .kafka, logger: testLogger("relay"),
            installSignalHandlers: false)
        let process = environment.process
        runTask = Task { try await process.run() }
        baseURL = "http://127.0.0.1:\(await process.waitForHTTPPort())"
    }

    func post(_ path: String, body: String, headers: [(String, String)] = []) async throws -> HTTPClientResponse {
        try await http.send("POST", baseURL + path, headers: [("Content-Type", "application/json")] + headers, body: Array(body.utf8))
    }

    func get(_ path: String) async throws -> HTTPClientResponse {
        try await http.send("GET", baseURL + path)
    }

    /// A fresh consumer group over the raw notifications topic, reading from the beginning.
    func notificationsReader() throws -> (any RecordConsumer, RecordCollector) {
        try reader(topic: configuration.topics.notifications)
    }

    /// A fresh consumer group over `topic`, reading from the beginning.
    func reader(topic: String) throws -> (any RecordConsumer, RecordCollector) {
        let consumer: any RecordConsumer
        if let cluster = environment.cluster {
            consumer = try KafkaConsumer(
                configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers),
                consumer: testConsumerConfiguration(group: uniqueName("reader"), topics: [topic]), logger: testLogger())
        } else {
            consumer = try environment.process.log.consumer(ConsumerOptions(groupID: uniqueName("reader"), topics: [topic]))
        }
        return (consumer, RecordCollector(consumer.records))
    }

    /// The records of `topic` up to its end now (a snapshot of the log: nothing waited for); with `atLeast`,
    /// once it holds that many.
    func records(topic: String, atLeast count: Int = 0) async throws -> [ConsumedRecord] {
        let log = environment.process.log
        @Sendable func snapshot() async throws -> [ConsumedRecord] {
            var records: [ConsumedRecord] = []
            for try await record in try log.snapshot(of: topic).records { records.append(record) }
            return records
        }
        guard count > 0 else { return try await snapshot() }
        let found = LockedBox<[ConsumedRecord]>([])
        try await waitUntil("\(count) records in \(topic)") {
            let records = try await snapshot()
            found.withLock { $0 = records }
            return records.count >= count
        }
        return found.value
    }

    /// The standardized events of `type` on the events topic now.
    func events(_ type: String) async throws -> [JSON] {
        try await records(topic: configuration.topics.events).compactMap { try? JSON.parse($0.value) }.filter { $0["type"]?.stringValue == type }
    }

    /// `events(type)` once the worker has processed everything appended so far: a route that answers when a
    /// state is written (a hand-over) answers before that state's events are produced.
    func settledEvents(_ type: String) async throws -> [JSON] {
        try await waitForWorker()
        return try await events(type)
    }

    /// How many different events of `type` (by `data.id`) the events topic holds: a repeated record is
    /// replayed with the same ids, which receivers deduplicate.
    func distinctEvents(_ type: String) async throws -> Int {
        Set(try await events(type).compactMap { $0["data"]?["id"]?.stringValue }).count
    }

    /// Waits until the worker has processed everything on the notifications topic now (its group's committed
    /// offsets reach the topic's ends): what was appended has had its effect, or been absorbed.
    func waitForWorker(timeout: Duration = .seconds(60)) async throws {
        try await waitFor(group: "relay-worker", topic: configuration.topics.notifications, timeout: timeout)
    }

    /// Waits until the worker, then the backend's recorder, have processed everything appended so far: the
    /// events store holds every event the notifications caused (the worker writes a state before it
    /// produces its events, so a state seen is not yet its events recorded). Needs the backend role in the
    /// relay's process (its recorder is the `relay-backend` group).
    func waitForRecordedEvents(timeout: Duration = .seconds(60)) async throws {
        try await waitForWorker(timeout: timeout)
        try await waitFor(group: "relay-backend", topic: configuration.topics.events, timeout: timeout)
    }

    private func waitFor(group: String, topic: String, timeout: Duration) async throws {
        let log = environment.process.log
        let ends = try log.partitionEnds(of: topic)
        try await waitUntil("\(group) caught up with \(topic)", timeout: timeout) {
            let committed = try log.committedOffsets(group: group, topic: topic)
            return ends.allSatisfy { $0.endOffset == $0.startOffset || (committed[$0.partition] ?? 0) >= $0.endOffset }
        }
    }

    /// A subscription's stored state, through the backend's internal route (key `test-backend-key`).
    func state(_ store: Store, _ id: String) async throws -> SubscriptionState? {
        let backendURL = await environment.process.backendAddress.value()
        let response = try await http.send(
            "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/\(store.rawValue)/\(PercentEncoding.pathSegment(id))",
            headers: [("Authorization", "Bearer test-backend-key")])
        return response.status == 200 ? try SubscriptionState(json: try JSON.parse(response.body)) : nil
    }

    /// The replay command's log option for this relay: `--bootstrap-servers` or `--data`.
    var logArguments: [String] {
        if let cluster = environment.cluster { return ["--bootstrap-servers", cluster.bootstrapServers] }
        return ["--data", environment.dataDirectory ?? ""]
    }

    func stop() async throws {
        await environment.process.triggerGracefulShutdown()
        try await runTask.value
    }
}

extension TestRelay {
    /// Runs a store's reconcile again (`run`) right after its first run (`first`), racing the worker: a
    /// correction the worker has not applied yet is appended again under the same record id (the object and
    /// its `reconcile` value) and absorbed; one it has applied is in sync now, and the subscription it ended
    /// (`ended`) is no longer listed. Either way the run finds nothing the first did not, and appends only
    /// record ids the first appended.
    func reconcileAgain(
        after first: ReconcileSummary, ended: (store: Store, id: String), _ run: () async throws -> ReconcileSummary,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        @Sendable func reconcileRecords() async throws -> [String] {
            try await records(topic: configuration.topics.notifications).compactMap { record in
                let body = try? JSON.parse(record.value)
                guard let object = body?["objectId"]?.stringValue, let value = body?["reconcile"]?.stringValue else { return nil }
                return "\(object):\(value)"
            }
        }
        let firstRecords = try await reconcileRecords()
        let second = try await run()
        #expect(second.failures.isEmpty, "\(second)", sourceLocation: sourceLocation)
        #expect(
            Set(second.corrections.map(\.originalTransactionId)).isSubset(of: Set(first.corrections.map(\.originalTransactionId))), "\(second)",
            sourceLocation: sourceLocation)
        if second.checked == first.checked - 1 {
            #expect(try await state(ended.store, ended.id)?.status == .expired, "\(second)", sourceLocation: sourceLocation)
        } else {
            #expect(second.checked == first.checked, "\(second)", sourceLocation: sourceLocation)
        }
        #expect(second.inSync + second.corrections.count == second.checked, "\(second)", sourceLocation: sourceLocation)
        let repeated = try await reconcileRecords().dropFirst(firstRecords.count)
        #expect(Set(repeated).isSubset(of: Set(firstRecords)), "\(Array(repeated)) against \(firstRecords)", sourceLocation: sourceLocation)
    }
}
