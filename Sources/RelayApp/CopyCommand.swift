public import Logging
public import RelayConfig
public import RelayCore
import RelayEmbeddedLog

/// `revenue-relay copy`: moving up from the embedded log to Kafka. With the relay stopped, copies what is
/// not finished yet to Kafka, so `run` on Kafka goes on where the embedded log stopped:
///
/// - the notifications topic after `relay-worker`'s stored offsets, the deliveries and retry topics after
///   `relay-deliverer`'s (records keep their headers, so a retry is still held until its due time), the
///   events and the delivery log's attempts after `relay-backend`'s (what the backend has not recorded yet);
/// - the dead-letter topic and the replay ledger whole (dead letters stay replayable; a replay already done
///   is recognized by endpoint and event, since positions change);
/// - with `history`, the events and rejected topics whole too (for sinks that read them from the start).
///
/// Records are appended in their order per partition (a key's records stay in order); each is acknowledged
/// by Kafka (acks=all, idempotent) before the next. The embedded log is opened as its owner, so a relay
/// still running on it makes the copy fail instead of racing it.
public enum CopyCommand {
    public struct TopicSummary: Sendable, Equatable {
        public var topic: String
        public var copied: Int
        /// Records left behind because the consuming group had finished them.
        public var skipped: Int64
    }

    public static func run(
        configuration: RelayConfiguration, from directory: String, to destination: any RecordLog, history: Bool, logger: Logger,
        progress: (String, Int) -> Void = { _, _ in }
    ) async throws -> [TopicSummary] {
        let source = try EmbeddedRecordLog.open(configuration: configuration, directory: directory, owner: true, logger: logger)
        let topics = configuration.topics
        var consumedBy = Dictionary(uniqueKeysWithValues: configuration.consumerGroups.flatMap { group in group.topics.map { ($0, group.group) } })
        var order = configuration.consumerGroups.flatMap(\.topics)
        order += [topics.deadLetter, topics.replayed]
        if history {
            // Whole, not only what the backend has not recorded yet (recording again is idempotent).
            consumedBy[topics.events] = nil
            order += [topics.rejected]
        }
        let producer = try destination.producer
        var summaries: [TopicSummary] = []
        do {
            for topic in order {
                var starts: [Int32: Int64] = [:]
                var skipped: Int64 = 0
                if let group = consumedBy[topic] {
                    starts = try source.committedOffsets(group: group, topic: topic)
                    for end in try source.partitionEnds(of: topic) {
                        skipped += max(0, min(starts[end.partition] ?? end.startOffset, end.endOffset) - end.startOffset)
                    }
                }
                var copied = 0
                let reader = try source.read(topic, from: starts, follow: false)
                for try await record in reader.records {
                    _ = try await producer.produce(OutgoingRecord(topic: topic, key: record.key, value: record.value, headers: record.headers))
                    copied += 1
                    if copied % 1000 == 0 { progress(topic, copied) }
                }
                summaries.append(TopicSummary(topic: topic, copied: copied, skipped: skipped))
            }
        } catch {
            await source.close()
            await destination.close()
            throw error
        }
        await source.close()
        await destination.close()
        return summaries
    }
}
