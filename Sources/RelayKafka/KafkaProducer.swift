public import CoreMetrics
public import Logging
public import RelayCore
internal import CRdKafka
import Synchronization

/// An idempotent, `acks=all` Kafka producer. Every send returns only once the broker acknowledged the
/// record (or throws when it could not within `deliveryTimeout`), so a caller that awaited a send
/// knows the record is durable.
///
/// Delivery reports are served on a dedicated thread; no blocking librdkafka call runs on Swift's
/// cooperative pool. That thread keeps the producer alive: call `close()` when done with it.
public final class KafkaProducer: RecordProducer, Sendable {
    private let client: RDKafkaClient
    private let pollThread: PollThread
    /// True once `close` began: later sends fail at once instead of queueing behind the final flush.
    private let closing = Mutex(false)
    private let logger: Logger
    /// `relay_kafka_produced_total{topic,outcome}`: every send counts one.
    private let produced: LabeledCounters

    public init(
        configuration: KafkaConfiguration,
        producer: KafkaProducerConfiguration = .init(),
        logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory
    ) throws(KafkaError) {
        let config = RDKafkaConfig()
        try config.set("bootstrap.servers", configuration.bootstrapServers)
        try config.set("client.id", configuration.clientID)
        try config.set("linger.ms", "5")
        // Reconnect within a second of a broker's return (librdkafka's default backoff grows to 10 s),
        // so the ingest stops answering 503 soon after Kafka is back.
        try config.set("reconnect.backoff.max.ms", "1000")
        try config.set("statistics.interval.ms", String(producer.statisticsInterval.wholeMilliseconds))
        try config.set(configuration.producerProperties)
        // The guarantees below are the point of this type; operators' properties cannot turn them off.
        try config.set("enable.idempotence", "true")
        try config.set("acks", "all")
        try config.set("message.timeout.ms", String(max(1, producer.deliveryTimeout.wholeMilliseconds)))

        let queuedGauge = Gauge(label: "relay_kafka_producer_queued_messages", dimensions: [], factory: metrics)
        let events = RDKafkaEvents(
            logger: logger,
            onStatistics: { statistics in queuedGauge.record(statistics.queuedMessages) }
        )
        let client = try RDKafkaClient.make(kind: .producer, config: config, events: events, deliveryReports: true)
        self.client = client
        self.logger = logger
        self.produced = LabeledCounters(label: "relay_kafka_produced_total", factory: metrics)
        self.pollThread = PollThread(
            name: "kafka-producer",
            body: { _ = rd_kafka_poll(client.pointer, 100) },
            finish: {
                // Give queued records a chance to be acknowledged, then fail what is left so every
                // waiting send gets its answer (purged records report _PURGE_QUEUE/_PURGE_INFLIGHT).
                _ = rd_kafka_flush(client.pointer, Int32(clamping: producer.deliveryTimeout.wholeMilliseconds))
                _ = rd_kafka_purge(client.pointer, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
                while rd_kafka_outq_len(client.pointer) > 0 { _ = rd_kafka_poll(client.pointer, 100) }
                _ = rd_kafka_poll(client.pointer, 0)
            }
        )
    }

    /// Whether a broker connection was up at the last statistics report (about once a second).
    public var isConnected: Bool { client.events.brokersReachable.load(ordering: .relaxed) }

    public func produce(_ record: OutgoingRecord) async throws(RecordLogError) -> RecordPosition {
        do {
            return try await send(record)
        } catch {
            throw error.recordLogError
        }
    }

    /// Sends one record and waits for the broker's acknowledgement.
    public func send(_ record: OutgoingRecord) async throws(KafkaError) -> RecordPosition {
        let result: RecordPositionValue
        do {
            result = try await withCheckedThrowingContinuation { continuation in
                let error = enqueue(record) { continuation.resume(with: $0.mapError { $0 as any Error }) }
                if let error { continuation.resume(throwing: error) }
            }
        } catch let error as KafkaError {
            produced.increment([("topic", record.topic), ("outcome", error.code.name)])
            throw error
        } catch {
            throw KafkaError(code: .unknown, reason: "\(error)", isRetriable: false)
        }
        produced.increment([("topic", record.topic), ("outcome", "acknowledged")])
        return RecordPosition(topic: result.topic, partition: result.partition, offset: result.offset)
    }

    public func produce(_ records: [OutgoingRecord]) async throws(RecordLogError) -> [RecordPosition] {
        do {
            return try await send(records)
        } catch {
            throw error.recordLogError
        }
    }

    /// Queues every record in order, then waits for all acknowledgements at once (one round trip).
    public func send(_ records: [OutgoingRecord]) async throws(KafkaError) -> [RecordPosition] {
        guard !records.isEmpty else { return [] }
        let positions: [RecordPosition]
        do {
            positions = try await withCheckedThrowingContinuation { continuation in
                let batch = AcknowledgementBatch(count: records.count, continuation: continuation)
                for (index, record) in records.enumerated() {
                    let error = enqueue(record) { result in
                        batch.complete(index, result.map { RecordPosition(topic: $0.topic, partition: $0.partition, offset: $0.offset) }.mapError { $0 })
                    }
                    guard let error else { continue }
                    // Nothing after a record that was not queued may be, or a retry would reorder them.
                    for skipped in index..<records.count { batch.complete(skipped, .failure(error)) }
                    break
                }
            }
        } catch let error as KafkaError {
            for record in records { produced.increment([("topic", record.topic), ("outcome", error.code.name)]) }
            throw error
        } catch {
            throw KafkaError(code: .unknown, reason: "\(error)", isRetriable: false)
        }
        for record in records { produced.increment([("topic", record.topic), ("outcome", "acknowledged")]) }
        return positions
    }

    /// Hands the record to librdkafka; returns the error when it did not take it.
    private func enqueue(_ record: OutgoingRecord, completion: @escaping @Sendable (Result<RecordPositionValue, KafkaError>) -> Void) -> KafkaError? {
        closing.withLock { isClosing -> KafkaError? in
            if isClosing { return .closed }
            guard let headers = rd_kafka_headers_new(record.headers.count) else {
                return KafkaError(code: .allocation, reason: "could not allocate record headers", isRetriable: true)
            }
            for header in record.headers {
                header.value.withUnsafeBytes { value in
                    _ = rd_kafka_header_add(headers, header.name, -1, value.baseAddress, value.count)
                }
            }
            let box = Unmanaged.passRetained(DeliveryBox(completion))
            let error: rd_kafka_resp_err_t = record.value.withUnsafeBytes { value in
                func produce(key: UnsafeRawBufferPointer?) -> rd_kafka_resp_err_t {
                    relay_rd_kafka_produce(
                        client.pointer, record.topic, key?.baseAddress, key?.count ?? 0,
                        value.baseAddress, value.count, headers, record.partition ?? relay_rd_kafka_partition_ua(), box.toOpaque())
                }
                if let key = record.key { return key.withUnsafeBytes { produce(key: $0) } }
                return produce(key: nil)
            }
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
                // librdkafka took neither the headers nor the opaque.
                rd_kafka_headers_destroy(headers)
                box.release()
                return KafkaError(error, context: "could not queue the record for topic \(record.topic)")
            }
            return nil
        }
    }

    /// Stops accepting sends, waits up to the delivery timeout for queued records to be acknowledged,
    /// fails the rest, and stops the poll thread. Every send that was waiting has its answer afterwards.
    public func close() async {
        let alreadyClosing = closing.withLock { isClosing in
            defer { isClosing = true }
            return isClosing
        }
        await pollThread.stop()
        if !alreadyClosing { logger.debug("kafka producer closed") }
    }
}
