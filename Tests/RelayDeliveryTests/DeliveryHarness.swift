import Foundation
import Logging
import RelayConfig
import RelayCore
import RelayDelivery
import RelayEmbeddedLog
import RelayTestSupport
import RelayVerification
import Synchronization

/// A deliverer on the in-memory record log (no broker; the same semantics as the embedded log, which
/// the end-to-end flow tests run on, next to Kafka) and real receivers on 127.0.0.1, with a compressed
/// retry schedule.
final class DeliveryHarness: Sendable {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    let log: EmbeddedRecordLog
    let configuration: RelayConfiguration
    let producer: any RecordProducer
    let group = uniqueName("relay-deliverer")
    let options: DelivererOptions
    private let running = LockedBox<[(deliverer: Deliverer, task: Task<Void, any Error>)]>([])

    /// - Parameter endpoints: `id: url` pairs; every endpoint takes every event of app `demo`.
    init(
        endpoints: [(String, String)], schedule: String = "[100ms, 100ms]", timeout: String = "2s", perEndpoint: Int = 64,
        allowPrivateNetworks: Bool = true, options: DelivererOptions? = nil, rateLimits: [String: String] = [:]
    ) throws {
        let endpointLines = endpoints.map { (id, url) -> String in
            let rate = rateLimits[id].map { ", rateLimit: \"\($0)\"" } ?? ""
            return "  - { id: \(id), app: demo, url: \"\(url)\", secrets: [\"\(Self.secret)\"], events: [\"*\"]\(rate) }"
        }.joined(separator: "\n")
        let yaml = """
            apps:
              - { key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_test"] } }
            endpoints:
            \(endpointLines)
            delivery: { timeout: \(timeout), retrySchedule: \(schedule), maxInFlight: 256, maxInFlightPerEndpoint: \(perEndpoint), allowPrivateNetworks: \(allowPrivateNetworks), allowHttp: true }
            """
        configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: FileManager.default.temporaryDirectory.path, environment: [:])
        log = try EmbeddedRecordLog.inMemory(
            topics: configuration.topics.all(retrySteps: configuration.delivery.retrySchedule.count), partitions: 2, logger: testLogger("log"))
        producer = try log.producer
        var options = options ?? DelivererOptions()
        if options.throttledMinimumWait == .seconds(60) { options.throttledMinimumWait = .milliseconds(300) }
        self.options = options
    }

    func consumer() throws -> any RecordConsumer {
        var options = Deliverer.consumerOptions(for: configuration)
        options.groupID = group
        return try log.consumer(options)
    }

    /// Starts a deliverer in the harness's group; `consumer` defaults to a real one.
    @discardableResult
    func start(consumer: (any RecordConsumer)? = nil) throws -> Deliverer {
        let deliverer = try Deliverer(
            configuration: configuration, consumer: consumer ?? self.consumer(), producer: producer, logger: testLogger("deliverer"),
            options: options)
        let task = Task { try await deliverer.run() }
        running.withLock { $0.append((deliverer, task)) }
        return deliverer
    }

    /// Stops every running deliverer (as a shutdown past its bound would: intake ends, the consumer closes).
    func stopDeliverers() async {
        let all = running.withLock { running in
            defer { running = [] }
            return running
        }
        for (_, task) in all {
            task.cancel()
            _ = try? await task.value
        }
    }

    /// Produces one delivery record the way the worker's fan-out does.
    @discardableResult
    func send(endpoint: String, eventID: String, type: String = "renewal", subject: String = "stripe:sub_1", body: String? = nil) async throws -> String {
        let payload = body ?? #"{"object":"event","type":"\#(type)","data":{"id":"\#(eventID)","name":"\#(type)"}}"#
        _ = try await producer.produce(
            DeliveryRecord.fresh(
                topic: configuration.topics.deliveries, endpoint: endpoint, subject: subject, body: Array(payload.utf8), eventID: eventID,
                eventType: type, app: "demo"))
        return payload
    }

    /// Reads a topic from its start, in a group of its own.
    func reader(_ topic: String) throws -> (any RecordConsumer, RecordCollector) {
        try reader([topic])
    }

    func reader(_ topics: [String]) throws -> (any RecordConsumer, RecordCollector) {
        let consumer = try log.consumer(ConsumerOptions(groupID: uniqueName("reader"), topics: topics))
        return (consumer, RecordCollector(consumer.records))
    }

    func close() async {
        await stopDeliverers()
        await log.close()
    }
}

extension ConsumedRecord {
    func header(_ name: String) -> String? { headers.first(named: name)?.stringValue }
}

extension RecordCollector {
    /// The delivery log's attempts read so far (its topic also carries endpoint states, which this skips),
    /// once at least `count` arrived.
    func attempts(count: Int) async throws -> [DeliveryAttempt] {
        try await waitUntil("\(count) attempts in the delivery log") { self.parsedAttempts.count >= count }
        return parsedAttempts
    }

    private var parsedAttempts: [DeliveryAttempt] { records.compactMap { try? JSON.parse($0.value) }.compactMap(DeliveryAttempt.init(json:)) }
}
