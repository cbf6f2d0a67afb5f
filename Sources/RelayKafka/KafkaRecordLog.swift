public import CoreMetrics
public import Logging
public import RelayCore
import Synchronization

/// The record log on Apache Kafka (or any Kafka-protocol broker): one idempotent, acks=all producer for
/// the process, made on first use; consumer-group members; readers of a whole topic.
public final class KafkaRecordLog: RecordLog {
    private let configuration: KafkaConfiguration
    private let producerConfiguration: KafkaProducerConfiguration
    private let logger: Logger
    private let metrics: any MetricsFactory
    private let shared = Mutex<(producer: KafkaProducer?, consumers: [KafkaConsumer])>((nil, []))

    /// - Parameter producer: the shared producer's settings (its `deliveryTimeout` bounds an acknowledgement).
    public init(
        configuration: KafkaConfiguration, producer: KafkaProducerConfiguration = KafkaProducerConfiguration(), logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory
    ) {
        self.configuration = configuration
        self.producerConfiguration = producer
        self.logger = logger
        self.metrics = metrics
    }

    public var producer: any RecordProducer {
        get throws(RecordLogError) { try kafkaProducer() }
    }

    /// The shared producer, made now if this is its first use.
    public func kafkaProducer() throws(RecordLogError) -> KafkaProducer {
        do {
            return try shared.withLock { (state) throws(KafkaError) -> KafkaProducer in
                if let producer = state.producer { return producer }
                let producer = try KafkaProducer(configuration: configuration, producer: producerConfiguration, logger: logger, metrics: metrics)
                state.producer = producer
                return producer
            }
        } catch {
            throw error.recordLogError
        }
    }

    public func consumer(_ options: ConsumerOptions) throws(RecordLogError) -> any RecordConsumer {
        var settings = KafkaConsumerConfiguration(groupID: options.groupID, topics: options.topics)
        settings.maxInFlight = options.maxInFlight
        settings.dueTime = options.dueTime
        settings.now = options.now
        let consumer: KafkaConsumer
        do {
            consumer = try KafkaConsumer(configuration: configuration, consumer: settings, logger: logger, metrics: metrics)
        } catch {
            throw error.recordLogError
        }
        shared.withLock { $0.consumers.append(consumer) }
        return consumer
    }

    public func snapshot(of topic: String) throws(RecordLogError) -> any TopicSnapshot {
        do {
            return KafkaSnapshot(reader: try KafkaTopicReader(configuration: configuration, topic: topic, logger: logger))
        } catch {
            throw error.recordLogError
        }
    }

    public func read(_ topic: String, from offsets: [Int32: Int64], follow: Bool) throws(RecordLogError) -> any TopicSnapshot {
        do {
            return KafkaSnapshot(reader: try KafkaTopicReader(configuration: configuration, topic: topic, startOffsets: offsets, follow: follow, logger: logger))
        } catch {
            throw error.recordLogError
        }
    }

    public func partitionEnds(of topic: String) throws(RecordLogError) -> [PartitionEnd] {
        do {
            return try KafkaTopicReader.partitionEnds(configuration: configuration, topic: topic, logger: logger)
        } catch {
            throw error.recordLogError
        }
    }

    public func committedOffsets(group: String, topic: String) throws(RecordLogError) -> [Int32: Int64] {
        do {
            return try KafkaTopicReader.committedOffsets(configuration: configuration, group: group, topic: topic, logger: logger)
        } catch {
            throw error.recordLogError
        }
    }

    /// A broker connection is up: the producer's when there is one, else a consumer's.
    public var isAvailable: Bool {
        shared.withLock { state in
            if let producer = state.producer { return producer.isConnected }
            return state.consumers.contains { $0.isConnected }
        }
    }

    public func close() async {
        await shared.withLock { $0.producer }?.close()
    }
}

/// A `KafkaTopicReader` as the log-neutral snapshot.
struct KafkaSnapshot: TopicSnapshot {
    let reader: KafkaTopicReader
    var expectedCount: Int64 { reader.expectedCount }
    var records: AsyncThrowingStream<ConsumedRecord, any Error> { reader.records }
    func close() async { await reader.close() }
}
