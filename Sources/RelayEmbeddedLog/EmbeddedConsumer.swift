import CoreMetrics
import Dispatch
import Foundation
import GRDB
import Logging
import RelayCore
import RelaySQLite
import Synchronization

/// A consumer-group reader of the embedded log, with the semantics the stages rely on from Kafka:
///
/// - Every partition of its topics, from the group's stored offset (or the partition's start), in order.
/// - A group's offset is stored only after `markDone`, and only over a contiguous done prefix
///   (`OffsetTracker`), every 100 ms and at close; a crash redelivers exactly what was not done.
/// - A record whose `dueTime` is later is held, and its partition behind it, until due: the thread sleeps
///   until the earliest due time (or new records), it never busy-waits.
/// - Back-pressure: no more than `maxInFlight` records out and not done.
/// - One process owns the log's data directory, so a group has one member and is never rebalanced:
///   `isAssigned` is always true.
///
/// Reading runs on a dedicated thread; appends in this process wake it at once, appends from another
/// process (a `replay`) are seen within `pollInterval`. It reads at once when it starts, again at once
/// while the log holds more than a pass read and there is room, and, when it stopped at `maxInFlight`,
/// as soon as a quarter of those records are done; appends do not wake it before that, so a record
/// appended meanwhile waits for that markDone (or the poll). With a `readInterval`, an append wakes it
/// no sooner than that interval after the previous read that handed records out (`run`).
final class EmbeddedConsumer: RecordConsumer, Sendable {
    static let defaultPollInterval: Duration = .milliseconds(100)
    static let storeInterval: Duration = .milliseconds(100)
    static let fetchLimit = 256
    /// Records a pass reads at most on the log writer's connection (about 0.8 MB of Apple notifications):
    /// appends wait while it reads.
    static let writerReadLimit = 64

    private struct Partition {
        var topic: LogDatabase.Topic
        var partition: Int32
        /// The next offset to read.
        var position: Int64
        var tracker = OffsetTracker()
        var held: (record: ConsumedRecord, due: Int64)?
        /// A new offset to store for the group, not yet written.
        var toStore: Int64?
    }

    private enum Sink {
        case stream(AsyncStream<ConsumedRecord>.Continuation)
        case handler(@Sendable (ConsumedRecord) -> Void)
    }

    private struct State {
        var partitions: [Partition] = []
        var inFlight = 0
        var sink: Sink?
        var started = false
        /// The reading thread runs (it must be waited for at close).
        var threadStarted = false
        /// `consume` was cancelled: hand out nothing more.
        var intakeStopped = false
        var closing = false
        /// Handler calls running now (a cancelled `consume` returns when none is).
        var handling = 0
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        /// The reading thread stopped at `maxInFlight` and sleeps until `markDone`s bring the count to `resumeMark`.
        var waitingForRoom = false
        /// An append's wake is signalled and the reading thread has not started its pass since: more
        /// appends need no signal of their own (the pass reads after they committed).
        var appendWakePending = false
        /// The last pass read every record there was: the next one reads what was appended since, which
        /// the writer's connection has in its page cache. Not before the first pass: a consumer starting
        /// (a restart) may have a backlog.
        var caughtUp = false

        /// Records held back (not yet due) among those in flight: one at most per partition, and no
        /// `markDone` makes them fewer, only their due time.
        var heldCount: Int { partitions.reduce(0) { $0 + ($1.held == nil ? 0 : 1) } }
    }

    let options: ConsumerOptions
    /// A reader stopped at `maxInFlight` reads again when fewer than this many are out and not held, as
    /// the Kafka consumer resumes (`ConsumerBookkeeping.resumeMark`).
    private let resumeMark: Int
    /// How long the reading thread sleeps when nothing wakes it (default 100 ms; tests set hours, so
    /// that only the wakes above can make it read).
    private let pollInterval: Duration
    private let database: LogDatabase
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let stream: AsyncStream<ConsumedRecord>
    private let streamContinuation: AsyncStream<ConsumedRecord>.Continuation
    private let logger: Logger
    private let consumed: Counter

    init(
        options: ConsumerOptions, database: LogDatabase, topics: [String: LogDatabase.Topic], pollInterval: Duration = defaultPollInterval,
        logger: Logger, metrics: any MetricsFactory
    ) throws {
        self.pollInterval = pollInterval
        // At least one record out at a time, as the Kafka consumer clamps it: 0 would never read.
        var options = options
        options.maxInFlight = max(1, options.maxInFlight)
        resumeMark = max(1, options.maxInFlight * 3 / 4)
        var groupLogger = logger
        groupLogger[metadataKey: LogKey.logGroup] = "\(options.groupID)"
        self.logger = groupLogger
        self.options = options
        self.database = database
        self.consumed = Counter(label: "relay_log_consumed_total", dimensions: [("group", options.groupID)], factory: metrics)
        var partitions: [Partition] = []
        for name in options.topics {
            guard let topic = topics[name] else {
                throw RecordLogError(code: .configuration, reason: "the embedded log has no topic \(name)", isRetriable: false)
            }
            let stored = try database.groupOffsets(options.groupID, topic: topic)
            let ends = try database.ends(of: topic)
            for end in ends {
                // A stored offset retention has passed since goes on at the oldest record kept.
                let position = max(stored[end.partition] ?? end.startOffset, end.startOffset)
                partitions.append(Partition(topic: topic, partition: end.partition, position: position))
            }
        }
        state.withLock { $0.partitions = partitions }
        (stream, streamContinuation) = AsyncStream.makeStream(of: ConsumedRecord.self, bufferingPolicy: .unbounded)
    }

    var subscribedTopics: Set<String> { Set(options.topics) }

    /// The reading thread stopped at `maxInFlight` and waits for the resume mark (for tests).
    var isWaitingForRoom: Bool { state.withLock { $0.waitingForRoom } }
    /// The passes so far that read records and handed some out (for tests).
    var handingOutReads: Int { handingOutReadCount.load(ordering: .relaxed) }
    private let handingOutReadCount = Atomic(0)
    /// The waits for `readInterval` so far (for tests).
    var intervalWaits: Int { intervalWaitCount.load(ordering: .relaxed) }
    private let intervalWaitCount = Atomic(0)

    /// New records may be there (an append in this process). No wake while the reading thread waits for
    /// room: it reads once `markDone`s reach the resume mark, and an append's wake before that read only
    /// the few records done since, in a read transaction of their own.
    func notify() {
        let signal = state.withLock { state -> Bool in
            guard !state.waitingForRoom, !state.appendWakePending else { return false }
            state.appendWakePending = true
            return true
        }
        if signal { wake.signal() }
    }

    var records: AsyncStream<ConsumedRecord> {
        start(.stream(streamContinuation))
        return stream
    }

    func consume(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) async {
        guard start(.handler(handler)) else { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if state.closing || (state.intakeStopped && state.handling == 0) { return true }
                    state.idleWaiters.append(continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.intakeStopped = true
                guard state.handling == 0 else { return [] }
                defer { state.idleWaiters = [] }
                return state.idleWaiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    @discardableResult
    private func start(_ sink: Sink) -> Bool {
        let first = state.withLock { state -> Bool in
            guard !state.started, !state.closing else { return false }
            state.started = true
            state.threadStarted = true
            state.sink = sink
            return true
        }
        if first { startDedicatedThread(named: "log-consumer") { [self] in run() } }
        return first
    }

    func markDone(_ record: ConsumedRecord) {
        let signal = state.withLock { state -> Bool in
            guard let index = state.partitions.firstIndex(where: { $0.topic.name == record.topic && $0.partition == record.partition }) else { return false }
            let (store, wasPending) = state.partitions[index].tracker.markDone(record.offset)
            if let store { state.partitions[index].toStore = store }
            if wasPending { state.inFlight -= 1 }
            // Woken only if the reader stopped for room: it records that under this lock, so a record
            // finishing after it looked is never missed (a wake on the count passing `maxInFlight - 1`
            // was: records finishing while a pass read left it asleep with room, for up to pollInterval).
            // Woken at a quarter of the bound free, like the Kafka consumer: one read hands out many records,
            // and the stage behind gets them together (one wake a record cost 3–8% more CPU per notification).
            // Held records are not counted: no markDone frees them, so with more of them than the mark the
            // reader would sleep until the poll or their due time while it had room.
            guard state.waitingForRoom, state.inFlight - state.heldCount < resumeMark else { return false }
            state.waitingForRoom = false
            return true
        }
        if signal { wake.signal() }
    }

    func isAssigned(_ record: ConsumedRecord) -> Bool { true }

    /// Stops reading, stores what was done, and ends `records`.
    func close() async {
        let (wasStarted, waiters) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            let started = state.threadStarted
            state.started = true
            state.closing = true
            defer { state.idleWaiters = [] }
            return (started, state.idleWaiters)
        }
        for waiter in waiters { waiter.resume() }
        if wasStarted {
            wake.signal()
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                startDedicatedThread(named: "log-consumer-close") { [self] in
                    finished.wait()
                    finished.signal()
                    continuation.resume()
                }
            }
        }
        // Never started: nothing was handed out, so there is nothing to store.
        streamContinuation.finish()
    }

    // MARK: The reading thread

    private func run() {
        var lastStore = ContinuousClock.now
        // The first pass at once: what the log already holds is not left waiting for an append or a poll.
        var wait = Duration.zero
        // When the last pass that handed records out began.
        var lastHandOut: ContinuousClock.Instant?
        while true {
            _ = wake.wait(timeout: .now() + .milliseconds(Int(wait.wholeMilliseconds)))
            // Woken by an append while records keep coming: read no sooner than `readInterval` after the last
            // read that handed some out, so that the appends meanwhile are read together (not when the last
            // pass left records behind: that reads on at once; nor while records are held for a due time,
            // which the interval must not make late). The appends meanwhile send no signal
            // (`appendWakePending` is still set); a markDone making room, or `close`, signals and ends the
            // wait at once.
            if options.readInterval > .zero, wait > .zero, let lastHandOut,
                state.withLock({ $0.appendWakePending && !$0.closing && $0.heldCount == 0 })
            {
                let remaining = lastHandOut + options.readInterval - .now
                if remaining > .zero {
                    intervalWaitCount.add(1, ordering: .relaxed)
                    _ = wake.wait(timeout: .now() + .nanoseconds(Int(remaining.wholeNanoseconds)))
                }
            }
            // Before the pass reads: an append that commits after this signals again.
            state.withLock { $0.appendWakePending = false }
            if ContinuousClock.now - lastStore >= Self.storeInterval {
                storeOffsets()
                lastStore = .now
            }
            if state.withLock({ $0.closing }) {
                storeOffsets()
                finished.signal()
                return
            }
            let started = ContinuousClock.now
            let handedOut: Bool
            (wait, handedOut) = pass()
            if handedOut { lastHandOut = started }
        }
    }

    /// Hands out what is due and there is room for; returns how long to sleep at most, and whether it read
    /// records and handed some out.
    private func pass() -> (wait: Duration, handedOut: Bool) {
        let now = options.now()
        var nextDue: Int64?
        // Held records are already counted in flight: release the due ones before any room check, or
        // held records filling maxInFlight would never come out.
        let due = state.withLock { state -> [ConsumedRecord] in
            guard !state.intakeStopped, !state.closing else { return [] }
            var due: [ConsumedRecord] = []
            for index in state.partitions.indices {
                guard let held = state.partitions[index].held else { continue }
                if held.due <= now {
                    due.append(held.record)
                    state.partitions[index].held = nil
                } else {
                    nextDue = min(nextDue ?? held.due, held.due)
                }
            }
            return due
        }
        for record in due { emit(record) }
        // The partitions and the room in one look: only this thread raises the count, so the room cannot
        // shrink before the read.
        let snapshot = state.withLock { state -> (partitions: [Partition], room: Int, caughtUp: Bool)? in
            if state.intakeStopped || state.closing { return nil }
            guard state.inFlight < options.maxInFlight else {
                state.waitingForRoom = true
                return nil
            }
            // Room without the markDone that clears it (a poll, an append's wake left from before it stopped):
            // it reads, so appends must wake it again.
            state.waitingForRoom = false
            return (state.partitions, options.maxInFlight - state.inFlight, state.caughtUp)
        }
        guard let (partitions, room, caughtUp) = snapshot else {
            guard let nextDue else { return (pollInterval, false) }
            return (.milliseconds(max(1, min(pollInterval.wholeMilliseconds, nextDue - options.now()))), false)
        }
        // One read transaction per pass: every partition's end, then the new records of those that have
        // some, as many as there is room for.
        //
        // A consumer that is caught up reads on the writer's connection, between its commits, at most
        // `writerReadLimit` records: that connection's page cache holds the pages just appended. A reader
        // connection of the pool drops its whole cache whenever another connection has committed, which at
        // a steady rate is before nearly every pass, and reads the pages it needs again from the WAL (10
        // `pread`s per notification among the three consumers; reading on the writer cut their threads'
        // CPU by a quarter, docs/benchmarks.md). A consumer behind (a backlog, a restart) reads on a reader
        // connection, as many as there is room for: those records are not in the writer's cache, and the
        // appends, the ingest's acknowledgements among them, would wait for the read.
        let onWriter = caughtUp
        let read = { (db: Database) throws -> (reads: [(index: Int, end: Int64, records: [ConsumedRecord])], left: Bool) in
            let ends = try LogDatabase.ends(db)
            var budget = onWriter ? min(room, Self.writerReadLimit) : room
            var reads: [(index: Int, end: Int64, records: [ConsumedRecord])] = []
            var left = false
            for index in partitions.indices {
                let partition = partitions[index]
                // Still held (not due): nothing behind it is read.
                if partition.held != nil { continue }
                let end = ends[LogDatabase.partitionKey(topic: partition.topic.id, partition: partition.partition)] ?? partition.position
                guard end > partition.position else { continue }
                guard budget > 0 else {
                    left = true
                    break
                }
                let records = try LogDatabase.records(
                    db, topic: partition.topic, partition: partition.partition, from: partition.position, limit: min(budget, Self.fetchLimit))
                budget -= records.count
                if let last = records.last, last.offset + 1 < end { left = true }
                reads.append((index, end, records))
            }
            return (reads, left)
        }
        let reads: [(index: Int, end: Int64, records: [ConsumedRecord])]
        // Records left in the log behind what this pass read (its budget or fetchLimit ran out).
        var left = false
        do {
            (reads, left) = try onWriter ? database.pool.readBetweenCommits(read) : database.pool.read(read)
            state.withLock { $0.caughtUp = !left }
        } catch {
            logger.warning("embedded log read failed; trying again", metadata: [LogKey.error: "\(error)"])
            return (pollInterval, false)
        }
        var handedOutAny = false
        for (index, end, fetched) in reads {
            for record in fetched {
                let due = options.dueTime?(record)
                let handedOut = state.withLock { state -> Bool in
                    guard !state.intakeStopped, !state.closing else { return false }
                    guard state.partitions[index].tracker.handOut(record.offset) else { return false }
                    state.partitions[index].position = record.offset + 1
                    state.inFlight += 1
                    if let due, due > now { state.partitions[index].held = (record, due) }
                    return true
                }
                guard handedOut else { continue }
                // Counted before the pass's first record goes out, so a test that has it sees its read counted.
                if !handedOutAny { handingOutReadCount.add(1, ordering: .relaxed) }
                handedOutAny = true
                consumed.increment()
                if let due, due > now {
                    nextDue = min(nextDue ?? due, due)
                    break
                }
                emit(record)
            }
            // Records after a gap (retention, compaction) start where the next kept one is.
            if fetched.isEmpty {
                state.withLock { $0.partitions[index].position = max($0.partitions[index].position, end) }
            }
        }
        // More to read: another pass at once. With room it reads; without, its first look records that the
        // reader waits for room, and a markDone wakes it. (Only after a pass that handed something out, so a
        // pass that cannot progress never spins.)
        if left && handedOutAny { return (.zero, true) }
        guard let nextDue else { return (pollInterval, handedOutAny) }
        return (.milliseconds(max(1, min(pollInterval.wholeMilliseconds, nextDue - options.now()))), handedOutAny)
    }

    private func emit(_ record: ConsumedRecord) {
        let sink = state.withLock { state -> Sink? in
            guard !state.intakeStopped, !state.closing else { return nil }
            state.handling += 1
            return state.sink
        }
        guard let sink else { return }
        switch sink {
        case .stream(let continuation): continuation.yield(record)
        case .handler(let handler): handler(record)
        }
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.handling -= 1
            guard state.intakeStopped, state.handling == 0 else { return [] }
            defer { state.idleWaiters = [] }
            return state.idleWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Writes the group's new offsets in one transaction.
    private func storeOffsets() {
        let pending = state.withLock { state -> [(topic: Int64, partition: Int32, offset: Int64)] in
            var pending: [(Int64, Int32, Int64)] = []
            for index in state.partitions.indices {
                if let offset = state.partitions[index].toStore {
                    pending.append((state.partitions[index].topic.id, state.partitions[index].partition, offset))
                    state.partitions[index].toStore = nil
                }
            }
            return pending
        }
        guard !pending.isEmpty else { return }
        do {
            try database.pool.write { db in
                for item in pending {
                    try db.cachedStatement(
                        sql: """
                            INSERT INTO group_offset (group_id, topic_id, partition, next_offset) VALUES (?, ?, ?, ?)
                            ON CONFLICT (group_id, topic_id, partition) DO UPDATE SET next_offset = MAX(next_offset, excluded.next_offset)
                            """
                    ).execute(arguments: [options.groupID, item.topic, item.partition, item.offset])
                }
            }
        } catch {
            // Kept for the next attempt: the offsets only move forward.
            logger.warning("storing consumer offsets failed; trying again", metadata: [LogKey.error: "\(error)"])
            state.withLock { state in
                for item in pending {
                    guard let index = state.partitions.firstIndex(where: { $0.topic.id == item.topic && $0.partition == item.partition }) else { continue }
                    state.partitions[index].toStore = max(state.partitions[index].toStore ?? item.offset, item.offset)
                }
            }
        }
    }
}
