public import RelayCore

/// How to reach Kafka and which raw librdkafka settings to pass through (docs/architecture.md, Kafka client guarantees).
public struct KafkaConfiguration: Sendable {
    /// `host:port[,host:port...]`.
    public var bootstrapServers: String
    /// Raw librdkafka settings (`kafka.properties`), applied after revenue-relay's own defaults so an
    /// operator can override them (security.protocol, sasl.*, ssl.*, ...). The settings revenue-relay's
    /// guarantees depend on (idempotence, acks, offset storing) are applied last and cannot be overridden.
    public var properties: [String: String]
    /// librdkafka `client.id`. Default: `revenue-relay`.
    public var clientID: String

    public init(bootstrapServers: String, properties: [String: String] = [:], clientID: String = "revenue-relay") {
        self.bootstrapServers = bootstrapServers
        self.properties = properties
        self.clientID = clientID
    }

    /// `properties` without the consumer-only settings, for a producer: `kafka.properties` is one map
    /// for both, and librdkafka warns at every start about a consumer setting given to a producer.
    var producerProperties: [String: String] {
        properties.filter { !Self.consumerOnly.contains($0.key) }
    }

    /// `properties` without the producer-only settings, for a consumer.
    var consumerProperties: [String: String] {
        properties.filter { !Self.producerOnly.contains($0.key) }
    }

    /// librdkafka's consumer-only ("C") and producer-only ("P") properties that an operator may set for
    /// one side (CONFIGURATION.md of librdkafka 2.0). Only these are held back; anything else, and every
    /// property valid for both ("*", e.g. `allow.auto.create.topics`), reaches both.
    static let consumerOnly: Set<String> = [
        "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
        "group.protocol.type", "coordinator.query.interval.ms", "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms",
        "enable.auto.offset.store", "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.message.max.bytes",
        "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms", "isolation.level",
        "enable.partition.eof", "check.crcs", "auto.offset.reset",
    ]
    static let producerOnly: Set<String> = [
        "transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee", "queue.buffering.max.messages",
        "queue.buffering.max.kbytes", "queue.buffering.max.ms", "linger.ms", "message.send.max.retries", "retries", "retry.backoff.ms",
        "queue.buffering.backpressure.threshold", "compression.codec", "compression.type", "batch.num.messages", "batch.size",
        "delivery.report.only.error", "sticky.partitioning.linger.ms", "request.required.acks", "acks", "request.timeout.ms",
        "message.timeout.ms", "delivery.timeout.ms", "partitioner", "compression.level",
    ]
}

/// Producer settings beyond the connection.
public struct KafkaProducerConfiguration: Sendable {
    /// How long a record may wait for the broker's acknowledgement before its send fails
    /// (librdkafka `message.timeout.ms`). Default: 10 s.
    public var deliveryTimeout: Duration = .seconds(10)
    /// How often librdkafka reports statistics (broker state, queue depth). Default: 1 s.
    public var statisticsInterval: Duration = .seconds(1)

    public init(deliveryTimeout: Duration = .seconds(10), statisticsInterval: Duration = .seconds(1)) {
        self.deliveryTimeout = deliveryTimeout
        self.statisticsInterval = statisticsInterval
    }
}

/// Consumer-group settings beyond the connection.
public struct KafkaConsumerConfiguration: Sendable {
    public var groupID: String
    public var topics: [String]
    /// Records handed out but not yet marked done before the consumer pauses its partitions.
    /// Default: 1000.
    public var maxInFlight: Int = 1000
    /// librdkafka `session.timeout.ms`. Default: 45 s (librdkafka's).
    public var sessionTimeout: Duration = .seconds(45)
    /// Where a group with no committed offset starts. Default: earliest, so nothing already in the topic is skipped.
    public var startFromEarliest: Bool = true
    /// How often stored offsets are committed (librdkafka `auto.commit.interval.ms`). Default: 1 s.
    public var commitInterval: Duration = .seconds(1)
    /// How often librdkafka reports statistics (consumer lag). Default: 5 s.
    public var statisticsInterval: Duration = .seconds(5)
    /// When a record may be handed out (Unix milliseconds), or nil for at once. A record not yet due is
    /// held back: its partition is paused at it, so nothing is fetched or handed out behind it, and is
    /// resumed once the record is due (checked on every poll, about every 100 ms). Nothing busy-waits, and
    /// the held record's offset is not stored, so a restart holds it again. Default: nil (nothing held).
    public var dueTime: (@Sendable (ConsumedRecord) -> Int64?)?
    /// The clock `dueTime` is compared with (Unix milliseconds). Default: the wall clock.
    public var now: @Sendable () -> Int64 = { wallClockMilliseconds() }

    public init(groupID: String, topics: [String]) {
        self.groupID = groupID
        self.topics = topics
    }
}
