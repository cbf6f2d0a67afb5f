import RelayCore

/// The consumer's partition, generation, in-flight and hold bookkeeping, as a value-type state machine.
///
/// Each mutating method takes plain values (partitions, offsets, generations, the time) and returns what
/// the caller must do: pause or resume partitions, store an offset, wait for room or signal it, emit
/// records. It calls no C, takes no lock and reads no clock, so it is tested without a broker.
/// `ConsumerShared` keeps it behind a mutex and performs its actions with librdkafka.
struct ConsumerBookkeeping: Sendable {
    struct Assigned: Sendable {
        var generation: UInt64
        var tracker = OffsetTracker()
    }

    /// Partitions to pause or resume in librdkafka. Never carries an empty set: that is `.none`.
    enum FetchAction: Equatable, Sendable {
        case none
        case pause(Set<TopicPartition>)
        case resume(Set<TopicPartition>)

        static func pausing(_ partitions: some Sequence<TopicPartition>) -> FetchAction {
            let partitions = Set(partitions)
            return partitions.isEmpty ? .none : .pause(partitions)
        }

        static func resuming(_ partitions: some Sequence<TopicPartition>) -> FetchAction {
            let partitions = Set(partitions)
            return partitions.isEmpty ? .none : .resume(partitions)
        }
    }

    /// What to do with a polled record.
    enum HandOut: Equatable, Sendable {
        /// Hand it out, tagged with its partition's assignment generation.
        case deliver(generation: UInt64)
        /// Drop it: librdkafka fetched an offset again that was already handed out in this assignment.
        case refetched
    }

    /// What a completion asks for.
    struct Completion: Equatable, Sendable {
        /// Store this offset (the next one to consume) for the partition, before any later completion does.
        var storeOffset: Int64?
        /// The in-flight count went down.
        var inFlightChanged = false
        /// The poll thread waits for room and now has it: signal it.
        var signalRoom = false
    }

    /// What the poll thread does before polling.
    enum RoomCheck: Equatable, Sendable {
        case poll
        /// `maxInFlight` records are out: wait for completions to make room instead of polling.
        case waitForRoom
    }

    /// The second stage of back-pressure (`applyBackPressure(now:)`).
    enum BackPressureAction: Equatable, Sendable {
        case none
        /// Back-pressure is on (`turnedOn`: from this call on): pause these partitions.
        case pause(Set<TopicPartition>, turnedOn: Bool)
        /// Back-pressure went off: resume these partitions (possibly none).
        case resume(Set<TopicPartition>)
    }

    /// Held records that came due, and the partitions that hold nothing any more and may fetch again.
    struct Release: Sendable {
        var records: [ConsumedRecord] = []
        var resume: FetchAction = .none
    }

    /// How long the poll thread may wait for room before it pauses the partitions and polls on.
    static let pauseAfter: Duration = .seconds(10)

    let maxInFlight: Int
    /// Polling resumes below this many records out.
    var resumeMark: Int { max(1, maxInFlight * 3 / 4) }

    private(set) var partitions: [TopicPartition: Assigned] = [:]
    private(set) var nextGeneration: UInt64 = 1
    private(set) var inFlight = 0
    /// Back-pressure is on: every assigned partition that has started delivering is to be paused.
    private(set) var paused = false
    /// The partitions currently paused by us for back-pressure.
    private(set) var pausedPartitions: Set<TopicPartition> = []
    /// The poll thread is waiting for completions to make room.
    private(set) var waitingForRoom = false
    /// Since when `maxInFlight` records have been out without a pause.
    private(set) var overLimitSince: ContinuousClock.Instant?
    /// Records not yet due, per partition (paused at them), in log order, with their due times.
    private(set) var held: [TopicPartition: [(record: ConsumedRecord, due: Int64)]] = [:]
    /// `consume(_:)` was cancelled: every partition stays paused until close.
    private(set) var intakeStopped = false

    init(maxInFlight: Int) {
        self.maxInFlight = max(1, maxInFlight)
    }

    // MARK: Records

    /// A polled record at `offset` of `partition` is about to be handed out; tracks its offset.
    mutating func handOut(_ partition: TopicPartition, offset: Int64) -> HandOut {
        if partitions[partition] == nil {
            partitions[partition] = Assigned(generation: nextGeneration)
            nextGeneration += 1
        }
        // A refetched offset is already done or still in flight: handing it out again could let
        // its copy store an offset past the unfinished original.
        guard let generation = partitions[partition]?.generation, partitions[partition]?.tracker.handOut(offset) == true else {
            return .refetched
        }
        inFlight += 1
        return .deliver(generation: generation)
    }

    /// The record at `offset` of `partition`, handed out in assignment `generation`, is done.
    mutating func markDone(_ partition: TopicPartition, offset: Int64, generation: UInt64) -> Completion {
        // A record from a partition since revoked (or revoked and assigned again) is not ours to store.
        guard partitions[partition]?.generation == generation, let done = partitions[partition]?.tracker.markDone(offset) else {
            return Completion()
        }
        if done.wasPending { inFlight -= 1 }
        var completion = Completion(storeOffset: done.store, inFlightChanged: done.wasPending)
        if waitingForRoom && inFlight < resumeMark {
            waitingForRoom = false
            completion.signalRoom = true
        }
        return completion
    }

    /// Whether `generation` is the current assignment of `partition`.
    func isAssigned(_ partition: TopicPartition, generation: UInt64) -> Bool {
        partitions[partition]?.generation == generation
    }

    // MARK: Records not yet due

    /// Holds back a record that is not yet due; the first one held pauses its partition at it.
    mutating func hold(_ record: ConsumedRecord, until due: Int64) -> FetchAction {
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        // Only records of this assignment: a revoked partition's record is dropped (its next owner reads it).
        guard partitions[key]?.generation == record.assignmentGeneration else { return .none }
        let first = held[key] == nil
        held[key, default: []].append((record, due))
        return first ? .pause([key]) : .none
    }

    /// The held records that are due at `now` (the `dueTime` clock), in log order per partition: a record
    /// stays held while one before it in its partition is not due. Partitions that hold nothing any more
    /// are resumed, unless back-pressure keeps them paused.
    mutating func releaseDue(now: Int64) -> Release {
        guard !held.isEmpty else { return Release() }
        var released: [ConsumedRecord] = []
        var toResume: [TopicPartition] = []
        for (key, queue) in held {
            var remaining = queue[...]
            while let first = remaining.first, first.due <= now {
                released.append(first.record)
                remaining = remaining.dropFirst()
            }
            guard remaining.count != queue.count else { continue }
            if remaining.isEmpty {
                held[key] = nil
                if paused { pausedPartitions.insert(key) } else { toResume.append(key) }
            } else {
                held[key] = Array(remaining)
            }
        }
        return Release(records: released, resume: .resuming(toResume))
    }

    /// Records held back because they are not yet due.
    var heldCount: Int { held.values.reduce(0) { $0 + $1.count } }

    // MARK: Rebalances

    /// The group assigned `keys` to this member: each starts a new generation, with nothing in flight or
    /// held. librdkafka keeps an application pause on a partition across unassign and reassign, so the
    /// result sets the state we want explicitly (fetching has not started yet, so either is safe): paused
    /// while back-pressure is on (or the intake stopped), resumed otherwise.
    mutating func assign(_ keys: some Collection<TopicPartition>) -> FetchAction {
        for key in keys {
            inFlight -= partitions[key]?.tracker.undoneCount ?? 0
            held[key] = nil
            partitions[key] = Assigned(generation: nextGeneration)
            nextGeneration += 1
            if paused { pausedPartitions.insert(key) } else { pausedPartitions.remove(key) }
        }
        return paused ? .pausing(keys) : .resuming(keys)
    }

    /// Forgets revoked partitions: what was done is stored already; what was not is dropped and will be
    /// redelivered to the partition's next owner, and so are their held records. If any of them was paused
    /// by us, resumes them all, to leave no application pause behind on a partition that may come back.
    mutating func revoke(_ keys: some Collection<TopicPartition>) -> FetchAction {
        var anyPaused = false
        for key in keys {
            if let assigned = partitions.removeValue(forKey: key) { inFlight -= assigned.tracker.undoneCount }
            if pausedPartitions.remove(key) != nil { anyPaused = true }
            if held.removeValue(forKey: key) != nil { anyPaused = true }
        }
        return anyPaused ? .resuming(keys) : .none
    }

    // MARK: Back-pressure

    /// Whether the poll thread should not poll now because `maxInFlight` records are out; if so it waits
    /// for completions to make room (below three quarters of it: `markDone` then says to signal it).
    /// After `pauseAfter` of waiting it says to poll, so polling goes on (group membership, rebalances)
    /// and `applyBackPressure(now:)` pauses the partitions instead.
    mutating func checkRoom(now: ContinuousClock.Instant) -> RoomCheck {
        // Hysteresis: polling stops at maxInFlight and starts again below three quarters of it.
        let limit = overLimitSince == nil ? maxInFlight : resumeMark
        guard inFlight >= limit, !paused else {
            overLimitSince = nil
            return .poll
        }
        let since = overLimitSince ?? now
        overLimitSince = since
        guard now - since < Self.pauseAfter else { return .poll }
        waitingForRoom = true
        return .waitForRoom
    }

    /// Second stage of back-pressure, when `maxInFlight` records stayed out for `pauseAfter` (an
    /// endpoint or the log is stuck): pauses the assigned partitions so polling can go on without
    /// handing out more, and resumes them at half of it. Pausing drops librdkafka's prefetched records
    /// (they are fetched again on resume), which is why it is not the first stage.
    ///
    /// Only partitions that delivered a record in this assignment are paused: pausing makes
    /// librdkafka's consumed position the resume point, and before the first record that position may
    /// still be one from an earlier ownership of the partition. Partitions that start delivering while
    /// back-pressure is on are paused on the next poll, so the overshoot is at most a fetch each.
    /// Once the intake stopped nothing is resumed any more.
    mutating func applyBackPressure(now: ContinuousClock.Instant) -> BackPressureAction {
        guard !intakeStopped else { return .none }
        var turnedOn = false
        if !paused && inFlight >= maxInFlight && overLimitSince.map({ now - $0 >= Self.pauseAfter }) ?? false {
            paused = true
            turnedOn = true
        } else if paused && inFlight <= maxInFlight / 2 {
            paused = false
            // A partition holding a record that is not yet due stays paused until it is.
            let resumed = pausedPartitions.subtracting(held.keys)
            pausedPartitions = []
            return .resume(resumed)
        }
        guard paused else { return .none }
        let started = partitions.filter { $0.value.tracker.hasHandedOut && !pausedPartitions.contains($0.key) }.keys
        pausedPartitions.formUnion(started)
        guard turnedOn || !started.isEmpty else { return .none }
        return .pause(Set(started), turnedOn: turnedOn)
    }

    /// `consume(_:)` was cancelled: pauses every assigned partition, and (through `paused`) every one
    /// assigned later, until close. Pauses nothing the second time.
    mutating func stopIntake() -> FetchAction {
        guard !intakeStopped else { return .none }
        intakeStopped = true
        paused = true
        pausedPartitions.formUnion(partitions.keys)
        return .pausing(partitions.keys)
    }
}
