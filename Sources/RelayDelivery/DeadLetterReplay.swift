public import RelayConfig
public import RelayCore

/// Which dead-lettered deliveries `replay` re-drives.
public struct ReplayFilter: Sendable {
    public var endpoint: String?
    public var type: String?
    /// Dead-lettered at or after, Unix milliseconds.
    public var since: Int64?
    /// Dead-lettered before, Unix milliseconds.
    public var until: Int64?
    /// Re-drive at most this many.
    public var limit: Int?

    public init(endpoint: String? = nil, type: String? = nil, since: Int64? = nil, until: Int64? = nil, limit: Int? = nil) {
        self.endpoint = endpoint
        self.type = type
        self.since = since
        self.until = until
        self.limit = limit
    }

    func matches(_ delivery: DeliveryRecord, deadLetteredAt: Int64?) -> Bool {
        if let endpoint, delivery.endpointID != endpoint { return false }
        if let type, delivery.eventType != type { return false }
        if since != nil || until != nil {
            guard let deadLetteredAt else { return false }
            if let since, deadLetteredAt < since { return false }
            if let until, deadLetteredAt >= until { return false }
        }
        return true
    }
}

/// What one replay run did.
public struct ReplaySummary: Sendable, Equatable {
    /// Dead-letter records read.
    public var scanned = 0
    /// Records that pass the filter (within `--limit`).
    public var matched = 0
    /// Re-produced to `relay.deliveries` (with `--dry-run`: would be).
    public var redriven = 0
    /// Matched but not re-driven: replayed by an earlier run.
    public var alreadyReplayed = 0
    /// Matched but not re-driven: the same endpoint and event already re-driven in this run.
    public var duplicates = 0

    public var skipped: Int { alreadyReplayed + duplicates }

    public init() {}
}

/// One dead-lettered delivery a replay looked at.
public struct ReplayCandidate: Sendable {
    /// `<topic>:<partition>:<offset>` of the dead-letter record.
    public var position: String
    public var delivery: DeliveryRecord
    public var deadLetteredAt: Int64?
}

/// `revenue-relay replay` (docs/contracts.md, Command line): re-drives dead-lettered deliveries.
///
/// 1. Reads the ledger topic (`kafka.topics.replayed`, compacted, key = dead-letter position) to learn
///    what earlier runs re-drove.
/// 2. Reads the dead-letter topic from its start to its end at that moment, filters by endpoint, type
///    and dead-letter time, and re-produces each match not yet replayed to `relay.deliveries`: same
///    key, body and event id (so the same `webhook-id`), a fresh attempt count, and
///    `relay-replayed-from`. At most `rate` per second.
/// 3. After each re-drive is acknowledged, records its position in the ledger, so running the same
///    replay again re-drives nothing. A crash between the two steps may re-drive one record twice on the
///    next run; it carries the same `webhook-id`.
public struct DeadLetterReplay: Sendable {
    private let topics: RelayConfiguration.Topics
    private let producer: any RecordProducer
    private let now: @Sendable () -> Int64

    public init(configuration: RelayConfiguration, producer: any RecordProducer, now: @escaping @Sendable () -> Int64 = { wallClockMilliseconds() }) {
        self.topics = configuration.topics
        self.producer = producer
        self.now = now
    }

    /// - Parameters:
    ///   - deadLetters: the dead-letter topic's snapshot; `ledger`: the ledger topic's.
    ///   - rate: re-drives per second at most.
    ///   - progress: called after each record read, with the summary so far and the expected total.
    ///   - candidate: called for each record that is (or with `dryRun`, would be) re-driven.
    public func run(
        deadLetters: any TopicSnapshot, ledger: any TopicSnapshot, filter: ReplayFilter, rate: Double, dryRun: Bool,
        progress: (ReplaySummary, Int64) -> Void = { _, _ in }, candidate: (ReplayCandidate) -> Void = { _ in }
    ) async throws -> ReplaySummary {
        // Positions re-driven before, and per endpoint and event the latest re-drive: a dead-letter
        // record of the same delivery from before that re-drive is covered by it (a duplicate), while one
        // dead-lettered after it failed again and is replayed again.
        var replayed = Set<String>()
        var latestReplay: [String: Int64] = [:]
        for try await record in ledger.records {
            guard let key = record.keyString else { continue }
            replayed.insert(key)
            if let entry = try? JSON.parse(record.value), let endpoint = entry["endpoint"]?.stringValue,
                let event = entry["eventId"]?.stringValue, let at = Timestamp.milliseconds(entry["replayedAt"]?.stringValue)
            {
                let identity = "\(endpoint)\u{0}\(event)"
                latestReplay[identity] = max(latestReplay[identity] ?? .min, at)
            }
        }
        await ledger.close()

        var summary = ReplaySummary()
        var seen = Set<String>()
        let interval = Duration.seconds(1) / max(rate, 0.001)
        let clock = ContinuousClock()
        var nextSlot = clock.now
        do {
            for try await record in deadLetters.records {
                summary.scanned += 1
                defer { progress(summary, deadLetters.expectedCount) }
                guard let delivery = DeliveryRecord(record) else { continue }
                let deadLetteredAt = delivery.deadLetteredAt ?? record.timestampMilliseconds
                guard filter.matches(delivery, deadLetteredAt: deadLetteredAt) else { continue }
                if let limit = filter.limit, summary.redriven >= limit { break }
                summary.matched += 1
                let position = "\(record.topic):\(record.partition):\(record.offset)"
                let identity = "\(delivery.endpointID)\u{0}\(delivery.eventID)"
                if replayed.contains(position) || (latestReplay[identity].map { $0 >= (deadLetteredAt ?? .max) } ?? false) {
                    summary.alreadyReplayed += 1
                    seen.insert(identity)
                    continue
                }
                guard seen.insert(identity).inserted else {
                    summary.duplicates += 1
                    continue
                }
                candidate(ReplayCandidate(position: position, delivery: delivery, deadLetteredAt: deadLetteredAt))
                if !dryRun {
                    if nextSlot > clock.now { try await clock.sleep(until: nextSlot) }
                    nextSlot = max(nextSlot, clock.now) + interval
                    _ = try await producer.produce(delivery.replayRecord(topic: topics.deliveries, from: position))
                    _ = try await producer.produce(ledgerRecord(position: position, delivery: delivery))
                }
                summary.redriven += 1
            }
        } catch {
            await deadLetters.close()
            throw error
        }
        await deadLetters.close()
        return summary
    }

    private func ledgerRecord(position: String, delivery: DeliveryRecord) -> OutgoingRecord {
        let value: JSON = .object([
            "replayedAt": .string(Timestamp.rfc3339(milliseconds: now())), "endpoint": .string(delivery.endpointID),
            "eventId": .string(delivery.eventID),
        ])
        return OutgoingRecord(topic: topics.replayed, key: Array(position.utf8), value: value.serialized())
    }
}
