import Synchronization

/// One header of a log record. Values are bytes; the relay's own headers are UTF-8 text.
public struct RecordHeader: Sendable, Hashable {
    public var name: String
    public var value: [UInt8]

    public init(name: String, value: [UInt8]) {
        self.name = name
        self.value = value
    }

    public init(name: String, value: String) {
        self.init(name: name, value: Array(value.utf8))
    }

    public var stringValue: String? { String(validating: value, as: UTF8.self) }
}

extension Array where Element == RecordHeader {
    /// The value of the first header with this name (names compare case-sensitively, as Kafka does).
    public func first(named name: String) -> RecordHeader? { first { $0.name == name } }
}

/// A record to append to a log topic.
public struct OutgoingRecord: Sendable, Hashable {
    public var topic: String
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [RecordHeader]
    /// The partition to append to; nil (almost always): the key's partition, or any for no key. Control
    /// records that every consumer of a topic must see go to each partition by number.
    public var partition: Int32?

    public init(topic: String, key: [UInt8]?, value: [UInt8], headers: [RecordHeader] = [], partition: Int32? = nil) {
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.partition = partition
    }
}

/// Where the log durably stored a record.
public struct RecordPosition: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }
}

/// A record read from a log topic. Hand it back to `RecordConsumer.markDone` once everything it
/// caused is durable; until then its offset is not stored and a restart redelivers it.
public struct ConsumedRecord: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [RecordHeader]
    /// Broker or producer timestamp, Unix milliseconds, when the log has one.
    public var timestampMilliseconds: Int64?
    /// Which assignment of the partition delivered this record; lets the consumer ignore completions
    /// for a partition that was revoked and assigned again in between.
    public var assignmentGeneration: UInt64

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8],
        headers: [RecordHeader], timestampMilliseconds: Int64?, assignmentGeneration: UInt64
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestampMilliseconds = timestampMilliseconds
        self.assignmentGeneration = assignmentGeneration
    }

    public var keyString: String? { key.flatMap { String(validating: $0, as: UTF8.self) } }
}

/// Appends records durably. `produce` returns only once the log acknowledged the record
/// (for Kafka: acks=all, idempotent), and throws when it could not within its bound.
public protocol RecordProducer: Sendable {
    func produce(_ record: OutgoingRecord) async throws(RecordLogError) -> RecordPosition
    /// Appends `records` in this order (records of one key keep it) and returns once every one is
    /// acknowledged, their positions in order; throws the first failure after all were answered. Logs
    /// acknowledge a batch together (one group commit, one broker round trip) where they can.
    func produce(_ records: [OutgoingRecord]) async throws(RecordLogError) -> [RecordPosition]
}

extension RecordProducer {
    /// One at a time: correct for any log, and what a log without batches does.
    public func produce(_ records: [OutgoingRecord]) async throws(RecordLogError) -> [RecordPosition] {
        var positions: [RecordPosition] = []
        positions.reserveCapacity(records.count)
        for record in records { positions.append(try await produce(record)) }
        return positions
    }
}

/// The acknowledgements of a batch of appends: resumes its continuation once every record was answered,
/// with the positions in order or the first failure.
public final class AcknowledgementBatch: Sendable {
    private struct State {
        var positions: [RecordPosition?]
        var remaining: Int
        var failure: (any Error)?
        var continuation: CheckedContinuation<[RecordPosition], any Error>?
    }

    private let state: Mutex<State>

    public init(count: Int, continuation: CheckedContinuation<[RecordPosition], any Error>) {
        state = Mutex(State(positions: Array(repeating: nil, count: count), remaining: count, continuation: continuation))
    }

    /// Record `index` was answered (each exactly once).
    public func complete(_ index: Int, _ result: Result<RecordPosition, any Error>) {
        let finished = state.withLock { state -> (CheckedContinuation<[RecordPosition], any Error>, Result<[RecordPosition], any Error>)? in
            switch result {
            case .success(let position): state.positions[index] = position
            case .failure(let error): if state.failure == nil { state.failure = error }
            }
            state.remaining -= 1
            guard state.remaining == 0, let continuation = state.continuation else { return nil }
            state.continuation = nil
            if let failure = state.failure { return (continuation, .failure(failure)) }
            return (continuation, .success(state.positions.map { $0! }))
        }
        if let (continuation, result) = finished { continuation.resume(with: result) }
    }
}

/// Reads records with at-least-once semantics: a record's position is stored only after
/// `markDone`, in order, even when records finish out of order.
public protocol RecordConsumer: Sendable {
    /// The records, in log order per partition. Ends when the consumer closes.
    var records: AsyncStream<ConsumedRecord> { get }
    /// Runs `handler` for every record, in log order per partition, until the task is cancelled or
    /// the consumer closes. A consumer may call it on its own thread, saving the hop to a task per
    /// record: `handler` must be short and never block. Use either this or `records`.
    func consume(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) async
    /// The record and everything it caused is durable: its position may be stored.
    func markDone(_ record: ConsumedRecord)
    /// Stops reading, stores what was marked done and leaves the group. `records` ends.
    func close() async
    /// Whether the record's partition is still assigned to this reader as when the record was read.
    /// After a rebalance took it away, another member reads the record again: stop working on it.
    func isAssigned(_ record: ConsumedRecord) -> Bool
}

extension RecordConsumer {
    public func isAssigned(_ record: ConsumedRecord) -> Bool { true }

    public func consume(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) async {
        for await record in records { handler(record) }
    }
}

/// A topic's records from its start to the end it had when reading began (replay, inspection).
public protocol TopicSnapshot: Sendable {
    /// An upper bound of the records to come (for progress).
    var expectedCount: Int64 { get }
    var records: AsyncThrowingStream<ConsumedRecord, any Error> { get }
    func close() async
}

/// What a consumer reads, as which group, and how; the same on every log.
public struct ConsumerOptions: Sendable {
    public var groupID: String
    public var topics: [String]
    /// Records handed out and not yet marked done before the consumer stops handing out more. Default: 1000.
    public var maxInFlight: Int = 1000
    /// When a record may be handed out (Unix milliseconds), or nil for at once. A record not yet due is
    /// held back, and its partition with it: nothing behind it is handed out until it is due. Nothing
    /// busy-waits, and a held record's offset is not stored, so a restart holds it again. Default: nil.
    public var dueTime: (@Sendable (ConsumedRecord) -> Int64?)?
    /// The clock `dueTime` is compared with (Unix milliseconds). Default: the wall clock.
    public var now: @Sendable () -> Int64 = { wallClockMilliseconds() }
    /// Embedded log only: woken by an append, the reader reads no sooner than this after its last read
    /// that handed records out, so that records appended close together are read, and handed to the stage,
    /// together (fewer reads, fewer wakes, fewer commits behind them). A record appended after a quiet spell
    /// longer than this is read at once; a reader with more in the log than one read, or holding records
    /// for their `dueTime`, reads without waiting. Kafka's consumer has its own (`fetch.wait.max.ms`,
    /// `fetch.min.bytes`) and ignores it. Default: zero, every append read at once.
    public var readInterval: Duration = .zero

    public init(
        groupID: String, topics: [String], maxInFlight: Int = 1000, dueTime: (@Sendable (ConsumedRecord) -> Int64?)? = nil,
        readInterval: Duration = .zero
    ) {
        self.groupID = groupID
        self.topics = topics
        self.maxInFlight = maxInFlight
        self.dueTime = dueTime
        self.readInterval = readInterval
    }
}

/// One partition's end as a consumer group sees it: where the log ends and where the group is.
public struct PartitionEnd: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    /// The offset the next appended record gets.
    public var endOffset: Int64
    /// The oldest offset still kept (retention removes older ones).
    public var startOffset: Int64

    public init(topic: String, partition: Int32, endOffset: Int64, startOffset: Int64) {
        self.topic = topic
        self.partition = partition
        self.endOffset = endOffset
        self.startOffset = startOffset
    }
}

/// The record log the stages run on: Kafka, or the embedded durable log of one machine (and an in-memory
/// one in tests). Stages depend on this, never on a log's client library.
public protocol RecordLog: Sendable {
    /// The process's one producer, shared by its roles.
    var producer: any RecordProducer { get throws(RecordLogError) }
    /// A consumer of `options.topics` in group `options.groupID`, holding records until due.
    func consumer(_ options: ConsumerOptions) throws(RecordLogError) -> any RecordConsumer
    /// `topic` from its start to its end now.
    func snapshot(of topic: String) throws(RecordLogError) -> any TopicSnapshot
    /// `topic` from `offsets` (per partition; a partition not named from its start) to its end now, or with
    /// `follow` on without end, yielding appends as they come (`tail`).
    func read(_ topic: String, from offsets: [Int32: Int64], follow: Bool) throws(RecordLogError) -> any TopicSnapshot
    /// Each partition of `topic` with its oldest kept and next offsets (`topics`, `tail`).
    func partitionEnds(of topic: String) throws(RecordLogError) -> [PartitionEnd]
    /// Where consumer group `group` goes on in each partition of `topic`; a partition it stored nothing for is absent.
    func committedOffsets(group: String, topic: String) throws(RecordLogError) -> [Int32: Int64]
    /// Whether appends can be acknowledged now (Kafka: a broker is reachable); readiness follows it.
    var isAvailable: Bool { get }
    /// Acknowledges what is in flight and closes the producer; after every stage has stopped.
    func close() async
}

/// Why the record log could not do what was asked.
public struct RecordLogError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        /// The log did not acknowledge in time (brokers unreachable, or overloaded).
        case timedOut = "timed_out"
        /// The local send queue is full; back off and try again.
        case queueFull = "queue_full"
        /// The client is shutting down or closed.
        case closed
        /// The record is larger than the log accepts.
        case recordTooLarge = "record_too_large"
        /// The client's configuration is wrong; fix the configuration.
        case configuration
        /// The log holds as much unprocessed work as its budget allows (the embedded log's
        /// `log.retentionBytes`); the same append succeeds once its consumers caught up.
        case full
        /// Anything else the log reported.
        case other
    }

    public var code: Code
    /// A human explanation, safe to log (never contains record contents).
    public var reason: String
    /// Whether the same call may succeed later unchanged.
    public var isRetriable: Bool

    public init(code: Code, reason: String, isRetriable: Bool) {
        self.code = code
        self.reason = reason
        self.isRetriable = isRetriable
    }

    public var description: String { "\(code.rawValue): \(reason)" }
}
