public import Logging
public import RelayCore
internal import CRdKafka
import Foundation
import Synchronization

/// Reads a whole topic once, from each partition's start to the end it had when reading began,
/// without a consumer group and without committing anything. For `replay` (the dead-letter topic and
/// its ledger), which must see everything there is and stop.
///
/// Blocking librdkafka calls run on the reader's own thread.
public final class KafkaTopicReader: Sendable {
    /// Records to read: the sum over partitions of end minus start when reading began (an upper bound:
    /// compaction and transaction markers leave gaps).
    public let expectedCount: Int64
    /// The records, in log order per partition. Ends after the last one, or early with the error.
    public let records: AsyncThrowingStream<ConsumedRecord, any Error>
    private let client: RDKafkaClient
    private let pollThread: PollThread
    private let stopping: StopFlag
    /// Records read ahead of the stream's reader.
    static let buffered = 4096

    /// Connects, finds the topic's partitions and their current ends, and starts reading.
    /// - Parameters:
    ///   - timeout: how long the metadata and offset queries may take (brokers unreachable).
    ///   - startOffsets: where to start per partition (a partition not named: its start).
    ///   - follow: read on past the ends, without end (`tail --follow`).
    public init(
        configuration: KafkaConfiguration, topic: String, timeout: Duration = .seconds(10), startOffsets: [Int32: Int64] = [:], follow: Bool = false,
        logger: Logger
    ) throws(KafkaError) {
        let config = RDKafkaConfig()
        try config.set("bootstrap.servers", configuration.bootstrapServers)
        try config.set("client.id", configuration.clientID)
        try config.set("group.id", "revenue-relay-reader")
        try config.set(configuration.consumerProperties)
        try config.set("enable.auto.commit", "false")
        try config.set("enable.auto.offset.store", "false")
        try config.set("enable.partition.eof", "true")
        try config.set("auto.offset.reset", "earliest")
        let client = try RDKafkaClient.make(kind: .consumer, config: config, events: RDKafkaEvents(logger: logger))
        rd_kafka_poll_set_consumer(client.pointer)
        let milliseconds = Int32(clamping: timeout.wholeMilliseconds)

        // Where each partition starts and ends now.
        var ends: [Int32: Int64] = [:]
        var expected: Int64 = 0
        let watermarks = try Self.partitionEnds(client: client, topic: topic, milliseconds: milliseconds, servers: configuration.bootstrapServers)
        guard let list = rd_kafka_topic_partition_list_new(Int32(watermarks.count)) else {
            throw KafkaError(code: .allocation, reason: "could not allocate a partition list", isRetriable: true)
        }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        for watermark in watermarks {
            let first = max(watermark.startOffset, startOffsets[watermark.partition] ?? watermark.startOffset)
            guard follow || watermark.endOffset > first else { continue }
            if !follow { ends[watermark.partition] = watermark.endOffset }
            expected += max(0, watermark.endOffset - first)
            rd_kafka_topic_partition_list_add(list, topic, watermark.partition).pointee.offset = first
        }
        if !ends.isEmpty || (follow && list.pointee.cnt > 0) {
            let assigned = rd_kafka_assign(client.pointer, list)
            guard assigned == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(assigned, context: "could not read \(topic)") }
        }

        // Bounded: a slow reader (replay's --rate) holds the poll thread back instead of the whole topic
        // piling up in memory.
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: ConsumedRecord.self, throwing: (any Error).self, bufferingPolicy: .bufferingOldest(Self.buffered))
        let remaining = Mutex(ends)
        let stopping = StopFlag()
        self.stopping = stopping
        if ends.isEmpty && !follow { continuation.finish() }
        self.expectedCount = expected
        self.records = stream
        self.client = client
        self.pollThread = PollThread(
            name: "kafka-reader",
            body: {
                guard follow || !remaining.withLock({ $0.isEmpty }) else {
                    Thread.sleep(forTimeInterval: 0.05)
                    return
                }
                guard let message = rd_kafka_consumer_poll(client.pointer, 100) else { return }
                defer { rd_kafka_message_destroy(message) }
                let value = message.pointee
                let finished: Bool
                if value.err == RD_KAFKA_RESP_ERR__PARTITION_EOF {
                    guard !follow else { return }
                    finished = remaining.withLock { ends in
                        if let end = ends[value.partition], value.offset >= end { ends[value.partition] = nil }
                        return ends.isEmpty
                    }
                } else if value.err != RD_KAFKA_RESP_ERR_NO_ERROR {
                    let error = KafkaError(value.err, context: "reading \(topic)")
                    if error.isRetriable {
                        logger.debug("topic read error; continuing", metadata: [LogKey.error: "\(error)"])
                        return
                    }
                    remaining.withLock { $0 = [:] }
                    continuation.finish(throwing: error)
                    return
                } else {
                    let (isWanted, last) = follow ? (true, false) : remaining.withLock { ends -> (Bool, Bool) in
                        guard let end = ends[value.partition], value.offset < end else { return (false, ends.isEmpty) }
                        if value.offset + 1 >= end { ends[value.partition] = nil }
                        return (true, ends.isEmpty)
                    }
                    if isWanted {
                        let record =
                            ConsumedRecord(
                                topic: topic, partition: value.partition, offset: value.offset,
                                key: value.key.map { Array(UnsafeRawBufferPointer(start: $0, count: value.key_len)) },
                                value: value.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: value.len)) } ?? [],
                                headers: ConsumerShared.headers(of: message), timestampMilliseconds: ConsumerShared.timestamp(of: message),
                                assignmentGeneration: 0)
                        // Full buffer: wait for the reader (or for close, which ends the stream).
                        while case .dropped = continuation.yield(record), !stopping.value.load(ordering: .relaxed) {
                            Thread.sleep(forTimeInterval: 0.005)
                        }
                    }
                    finished = last
                }
                if finished { continuation.finish() }
            },
            finish: {
                continuation.finish()
                _ = rd_kafka_consumer_close(client.pointer)
            })
    }

    /// Each partition of `topic` with its low and high watermarks, from the metadata and offset queries.
    static func partitionEnds(client: RDKafkaClient, topic: String, milliseconds: Int32, servers: String) throws(KafkaError) -> [PartitionEnd] {
        guard let handle = rd_kafka_topic_new(client.pointer, topic, nil) else {
            throw KafkaError(code: .topic, reason: "could not open topic \(topic)", isRetriable: false)
        }
        defer { rd_kafka_topic_destroy(handle) }
        var metadata: UnsafePointer<rd_kafka_metadata>?
        let fetched = rd_kafka_metadata(client.pointer, 0, handle, &metadata, milliseconds)
        guard fetched == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
            throw KafkaError(fetched, context: "could not read the metadata of \(topic) from \(servers)")
        }
        defer { rd_kafka_metadata_destroy(metadata) }
        guard metadata.pointee.topic_cnt == 1, let topicMetadata = metadata.pointee.topics, topicMetadata.pointee.err == RD_KAFKA_RESP_ERR_NO_ERROR
        else {
            let error = metadata.pointee.topic_cnt == 1 ? metadata.pointee.topics.pointee.err : RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
            throw KafkaError(error, context: "topic \(topic)")
        }
        var result: [PartitionEnd] = []
        for partition in (0..<Int(topicMetadata.pointee.partition_cnt)).map({ topicMetadata.pointee.partitions[$0].id }).sorted() {
            var low: Int64 = 0
            var high: Int64 = 0
            let queried = rd_kafka_query_watermark_offsets(client.pointer, topic, partition, &low, &high, milliseconds)
            guard queried == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(queried, context: "could not read the offsets of \(topic)[\(partition)]")
            }
            result.append(PartitionEnd(topic: topic, partition: partition, endOffset: high, startOffset: low))
        }
        return result
    }

    /// `topic`'s partitions with their ends, through a short-lived client.
    public static func partitionEnds(configuration: KafkaConfiguration, topic: String, timeout: Duration = .seconds(10), logger: Logger) throws(KafkaError)
        -> [PartitionEnd]
    {
        let client = try metadataClient(configuration: configuration, group: "revenue-relay-reader", logger: logger)
        defer { rd_kafka_consumer_close(client.pointer) }
        return try partitionEnds(client: client, topic: topic, milliseconds: Int32(clamping: timeout.wholeMilliseconds), servers: configuration.bootstrapServers)
    }

    /// Where consumer group `group` goes on in each partition of `topic` (committed offsets; without
    /// joining the group).
    public static func committedOffsets(
        configuration: KafkaConfiguration, group: String, topic: String, timeout: Duration = .seconds(10), logger: Logger
    ) throws(KafkaError) -> [Int32: Int64] {
        let client = try metadataClient(configuration: configuration, group: group, logger: logger)
        defer { rd_kafka_consumer_close(client.pointer) }
        let milliseconds = Int32(clamping: timeout.wholeMilliseconds)
        let partitions = try partitionEnds(client: client, topic: topic, milliseconds: milliseconds, servers: configuration.bootstrapServers)
        guard let list = rd_kafka_topic_partition_list_new(Int32(partitions.count)) else {
            throw KafkaError(code: .allocation, reason: "could not allocate a partition list", isRetriable: true)
        }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        for partition in partitions { rd_kafka_topic_partition_list_add(list, topic, partition.partition) }
        let queried = rd_kafka_committed(client.pointer, list, milliseconds)
        guard queried == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(queried, context: "could not read group \(group)'s offsets") }
        var result: [Int32: Int64] = [:]
        for index in 0..<Int(list.pointee.cnt) {
            let element = list.pointee.elems[index]
            if element.offset >= 0 { result[element.partition] = element.offset }
        }
        return result
    }

    private static func metadataClient(configuration: KafkaConfiguration, group: String, logger: Logger) throws(KafkaError) -> RDKafkaClient {
        let config = RDKafkaConfig()
        try config.set("bootstrap.servers", configuration.bootstrapServers)
        try config.set("client.id", configuration.clientID)
        try config.set("group.id", group)
        try config.set(configuration.consumerProperties)
        try config.set("enable.auto.commit", "false")
        return try RDKafkaClient.make(kind: .consumer, config: config, events: RDKafkaEvents(logger: logger))
    }

    /// Stops reading (the stream ends) and closes the connection.
    public func close() async {
        stopping.value.store(true, ordering: .relaxed)
        await pollThread.stop()
    }
}

private final class StopFlag: Sendable {
    let value = Atomic<Bool>(false)
}
