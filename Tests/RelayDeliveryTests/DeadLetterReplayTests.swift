import RelayConfig
import RelayCore
import RelayDelivery
import Synchronization
import Testing

/// `DeadLetterReplay`'s choices on given topic contents (the Kafka run is in RelayIntegrationTests).
@Suite struct ReplayTests {
    struct Snapshot: TopicSnapshot {
        let items: [ConsumedRecord]
        var expectedCount: Int64 { Int64(items.count) }
        var records: AsyncThrowingStream<ConsumedRecord, any Error> {
            AsyncThrowingStream { continuation in
                for item in items { continuation.yield(item) }
                continuation.finish()
            }
        }
        func close() async {}
    }

    final class Recorder: RecordProducer {
        let produced = Mutex<[OutgoingRecord]>([])
        func produce(_ record: OutgoingRecord) async throws(RecordLogError) -> RecordPosition {
            produced.withLock { $0.append(record) }
            return RecordPosition(topic: record.topic, partition: 0, offset: 0)
        }
        var records: [OutgoingRecord] { produced.withLock { $0 } }
    }

    static func dead(_ offset: Int64, endpoint: String = "hooks", event: String, type: String = "renewal", at: String) -> ConsumedRecord {
        ConsumedRecord(
            topic: "relay.deliveries.dlq", partition: 0, offset: offset, key: Array("\(endpoint):sub".utf8), value: Array("{}".utf8),
            headers: [
                RecordHeader(name: DeliveryHeaderName.endpoint, value: endpoint), RecordHeader(name: RelayHeaderName.eventId, value: event),
                RecordHeader(name: RelayHeaderName.eventType, value: type), RecordHeader(name: RelayHeaderName.app, value: "demo"),
                RecordHeader(name: DeliveryHeaderName.attempts, value: "8"),
                RecordHeader(name: DeliveryHeaderName.deadLetterReason, value: "retries_exhausted"),
                RecordHeader(name: DeliveryHeaderName.deadLetteredAt, value: at),
            ],
            timestampMilliseconds: nil, assignmentGeneration: 0)
    }

    static func ledger(_ position: String, event: String, at: String) -> ConsumedRecord {
        ConsumedRecord(
            topic: "relay.deliveries.dlq.replayed", partition: 0, offset: 0, key: Array(position.utf8),
            value: JSON.object(["replayedAt": .string(at), "endpoint": "hooks", "eventId": .string(event)]).serialized(), headers: [],
            timestampMilliseconds: nil, assignmentGeneration: 0)
    }

    let configuration = try! RelayConfiguration.parse(
        yaml: "apps: [{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x] } }]", baseDirectory: "/", environment: [:])

    @Test func redrivesEachDeliveryOnceAcrossDuplicatesAndRuns() async throws {
        let dlq = Snapshot(items: [
            Self.dead(0, event: "e1", at: "2026-11-20T10:00:00Z"),
            Self.dead(1, event: "e1", at: "2026-11-20T10:05:00Z"),  // the same delivery dead-lettered twice
            Self.dead(2, event: "e2", at: "2026-11-20T11:00:00Z"),
            Self.dead(3, event: "e3", at: "2026-11-20T12:00:00Z"),  // e3 failed again after an earlier replay
            Self.dead(4, endpoint: "other", event: "e4", at: "2026-11-20T12:00:00Z"),
        ])
        let ledger = Snapshot(items: [Self.ledger("relay.deliveries.dlq:0:9", event: "e3", at: "2026-11-20T11:30:00Z")])
        let producer = Recorder()
        let replay = DeadLetterReplay(configuration: configuration, producer: producer, now: { 1_800_000_000_000 })
        let summary = try await replay.run(
            deadLetters: dlq, ledger: ledger, filter: ReplayFilter(endpoint: "hooks"), rate: 10_000, dryRun: false)
        #expect(summary.matched == 4)
        #expect(summary.redriven == 3)
        #expect(summary.duplicates == 1)
        let redriven = producer.records.filter { $0.topic == "relay.deliveries" }
        #expect(redriven.compactMap { $0.headers.first(named: RelayHeaderName.eventId)?.stringValue } == ["e1", "e2", "e3"])
        #expect(redriven.first?.headers.first(named: DeliveryHeaderName.replayedFrom)?.stringValue == "relay.deliveries.dlq:0:0")
        #expect(redriven.first?.headers.first(named: DeliveryHeaderName.attempts) == nil, "a fresh attempt count")
        let entries = producer.records.filter { $0.topic == "relay.deliveries.dlq.replayed" }
        #expect(entries.compactMap { String(decoding: $0.key ?? [], as: UTF8.self) } == [
            "relay.deliveries.dlq:0:0", "relay.deliveries.dlq:0:2", "relay.deliveries.dlq:0:3",
        ])

        // The second run sees the ledger: nothing again, the duplicate included, whatever the order.
        let second = Recorder()
        let again = try await DeadLetterReplay(configuration: configuration, producer: second).run(
            deadLetters: Snapshot(items: dlq.items.reversed()), ledger: Snapshot(items: ledger.items + entries.map { entry in
                ConsumedRecord(
                    topic: entry.topic, partition: 0, offset: 0, key: entry.key, value: entry.value, headers: [], timestampMilliseconds: nil,
                    assignmentGeneration: 0)
            }), filter: ReplayFilter(endpoint: "hooks"), rate: 10_000, dryRun: false)
        #expect(again.redriven == 0)
        #expect(again.alreadyReplayed == 4)
        #expect(second.records.isEmpty)
    }

    @Test func filtersByTypeAndTimeLimitsAndDryRunsProduceNothing() async throws {
        let dlq = Snapshot(items: (0..<6).map { index in
            Self.dead(Int64(index), event: "e\(index)", type: index % 2 == 0 ? "renewal" : "cancellation", at: "2026-11-20T1\(index):00:00Z")
        })
        let producer = Recorder()
        var listed: [String] = []
        let summary = try await DeadLetterReplay(configuration: configuration, producer: producer).run(
            deadLetters: dlq, ledger: Snapshot(items: []),
            filter: ReplayFilter(type: "renewal", since: Timestamp.milliseconds("2026-11-20T11:00:00Z"), until: Timestamp.milliseconds("2026-11-20T15:00:00Z")),
            rate: 10_000, dryRun: true, candidate: { listed.append($0.delivery.eventID) })
        #expect(listed == ["e2", "e4"])
        #expect(summary.redriven == 2)
        #expect(producer.records.isEmpty)

        let limited = try await DeadLetterReplay(configuration: configuration, producer: producer).run(
            deadLetters: dlq, ledger: Snapshot(items: []), filter: ReplayFilter(limit: 2), rate: 10_000, dryRun: false)
        #expect(limited.redriven == 2)
        #expect(producer.records.filter { $0.topic == "relay.deliveries" }.count == 2)
    }

    @Test func theRateBoundsRedrivesPerSecond() async throws {
        let dlq = Snapshot(items: (0..<5).map { Self.dead(Int64($0), event: "e\($0)", at: "2026-11-20T10:00:00Z") })
        let start = ContinuousClock.now
        _ = try await DeadLetterReplay(configuration: configuration, producer: Recorder()).run(
            deadLetters: dlq, ledger: Snapshot(items: []), filter: ReplayFilter(), rate: 20, dryRun: false)
        // Five re-drives at 20/s: the first at once, then one every 50 ms.
        #expect(ContinuousClock.now - start >= .milliseconds(200))
    }
}
