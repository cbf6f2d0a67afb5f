import Foundation
import GRDB
import RelayCore
import Synchronization

/// A topic from each partition's start (`ends[].startOffset`) to the end it had when the snapshot was
/// taken, read in batches; with `follow`, on past those ends without end, checking for appends every 200 ms.
struct EmbeddedSnapshot: TopicSnapshot {
    let database: LogDatabase
    let topic: LogDatabase.Topic
    let ends: [PartitionEnd]
    var follow = false

    var expectedCount: Int64 { ends.reduce(0) { $0 + max(0, $1.endOffset - $1.startOffset) } }

    var records: AsyncThrowingStream<ConsumedRecord, any Error> {
        struct Cursor {
            var remaining: ArraySlice<PartitionEnd>
            var buffer: [ConsumedRecord] = []
            var position: Int64
        }
        let database = database
        let topic = topic
        if follow { return followed() }
        let cursor = Mutex(Cursor(remaining: ends[...], position: ends.first?.startOffset ?? 0))
        return AsyncThrowingStream {
            while true {
                if let next = cursor.withLock({ $0.buffer.popLast() }) { return next }
                guard let (current, from) = cursor.withLock({ cursor in cursor.remaining.first.map { ($0, cursor.position) } }) else { return nil }
                let batch = try await database.pool.read { db in
                    try LogDatabase.records(db, topic: topic, partition: current.partition, from: from, below: current.endOffset, limit: 512)
                }
                cursor.withLock { cursor in
                    if let last = batch.last {
                        cursor.buffer = batch.reversed()
                        cursor.position = last.offset + 1
                    } else {
                        cursor.remaining = cursor.remaining.dropFirst()
                        cursor.position = cursor.remaining.first?.startOffset ?? 0
                    }
                }
            }
        }
    }

    /// Every partition in turn from its start position, sleeping when none has anything new.
    private func followed() -> AsyncThrowingStream<ConsumedRecord, any Error> {
        let database = database
        let topic = topic
        let positions = Mutex((positions: Dictionary(uniqueKeysWithValues: ends.map { ($0.partition, $0.startOffset) }), buffer: [ConsumedRecord]()))
        return AsyncThrowingStream {
            while true {
                if let next = positions.withLock({ $0.buffer.popLast() }) { return next }
                let from = positions.withLock { $0.positions }
                let batch = try await database.pool.read { db in
                    var batch: [ConsumedRecord] = []
                    for (partition, position) in from.sorted(by: { $0.key < $1.key }) {
                        batch += try LogDatabase.records(db, topic: topic, partition: partition, from: position, limit: 256)
                    }
                    return batch
                }
                if batch.isEmpty {
                    try await Task.sleep(for: .milliseconds(200))
                    continue
                }
                positions.withLock { state in
                    for record in batch { state.positions[record.partition] = max(state.positions[record.partition] ?? 0, record.offset + 1) }
                    state.buffer = batch.reversed()
                }
            }
        }
    }

    func close() async {}
}
