import RelayCore
@testable import RelayEmbeddedLog
import RelayTestSupport
import Synchronization
import Testing

/// When the embedded log's consumer reads: at once when it starts, on an append, at once again while the log
/// holds more than a pass read, and, stopped at `maxInFlight`, as soon as a quarter of those records are
/// done (not on each append before that). Its poll is set to an
/// hour here, so a read that waited for the poll instead of one of these wakes never comes and the test
/// fails at its bound; a stage fed by such a consumer ran at `maxInFlight` records per 100 ms poll.
@Suite struct EmbeddedConsumerWakeTests {
    static let topic = "wake"

    private func log(holding count: Int) async throws -> EmbeddedRecordLog {
        let log = try EmbeddedRecordLog.inMemory(topics: [Self.topic], partitions: 1, consumerPollInterval: .seconds(3_600), logger: testLogger())
        // Appended before any consumer exists: no append wakes one.
        let records = (0..<count).map { OutgoingRecord(topic: Self.topic, key: Array("k\($0)".utf8), value: Array("\($0)".utf8)) }
        _ = try await log.producer.produce(records)
        return log
    }

    @Test func aBacklogLongerThanOneReadIsHandedOutWithoutAnAppendOrAPoll() async throws {
        // 600 records: more than one pass reads (256, or 64 on the writer's connection), fewer than the bound.
        let log = try await log(holding: 600)
        let consumer = try log.consumer(ConsumerOptions(groupID: "backlog", topics: [Self.topic], maxInFlight: 1_000))
        let collector = RecordCollector(consumer.records)
        let records = try await collector.waitFor(count: 600, timeout: .seconds(60))
        #expect(records.map { text($0.value) } == (0..<600).map(String.init))
        collector.cancel()
        await consumer.close()
        await log.close()
    }

    @Test func recordsFinishingConcurrentlyWakeTheStoppedReaderUntilTheBacklogIsDone() async throws {
        let total = 2_000
        let bound = 4
        let log = try await log(holding: total)
        let consumer = try log.consumer(ConsumerOptions(groupID: "refill", topics: [Self.topic], maxInFlight: bound))
        let counts = Counts()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                await withTaskGroup(of: Void.self) { finishing in
                    for await record in consumer.records {
                        let outstanding = counts.started.add(1, ordering: .sequentiallyConsistent).newValue - counts.finished.load(ordering: .sequentiallyConsistent)
                        counts.mostOutstanding.max(outstanding, ordering: .relaxed)
                        // Finished out of order and concurrently, as a stage's tasks finish them: some while the
                        // consumer is between reading and handing out.
                        finishing.addTask {
                            if Bool.random() { await Task.yield() }
                            counts.finished.add(1, ordering: .sequentiallyConsistent)
                            consumer.markDone(record)
                        }
                        if counts.started.load(ordering: .relaxed) == total { break }
                    }
                }
            }
            group.addTask {
                try await Task.sleep(for: .seconds(60))
                throw TestTimeout(what: "\(total) records through a bound of \(bound) (\(counts.started.load(ordering: .relaxed)) came)")
            }
            try await group.next()
            group.cancelAll()
        }
        #expect(counts.started.load(ordering: .relaxed) == total)
        #expect(counts.mostOutstanding.load(ordering: .relaxed) <= bound)
        await consumer.close()
        await log.close()
    }

    @Test func aReaderStoppedAtItsBoundWaitsForAQuarterDoneNotForTheNextAppend() async throws {
        // A bound of 8 resumes at 6 in flight. Before, each append woke the stopped reader, which read the one
        // or two records done since in a read of its own; under load that was a stream of tiny reads.
        // Nine records before the consumer exists: its first read hands out 8, finds the ninth left, and stops
        // at the bound (no append is involved, so no wake is left over for later).
        let log = try await log(holding: 9)
        let consumer = try #require(try log.consumer(ConsumerOptions(groupID: "gate", topics: [Self.topic], maxInFlight: 8)) as? EmbeddedConsumer)
        let collector = RecordCollector(consumer.records)
        let first = try await collector.waitFor(count: 8, timeout: .seconds(60))
        try await waitUntil("the reader stopped at its bound", timeout: .seconds(60)) { consumer.isWaitingForRoom }
        consumer.markDone(first[0])
        _ = try await log.producer.produce([OutgoingRecord(topic: Self.topic, key: Array("k9".utf8), value: Array("9".utf8))])
        // Seven in flight, above the mark: neither the markDone nor the append makes it read. (Nothing can come
        // later that would not come at once: without the gate the append's read takes microseconds.)
        try await Task.sleep(for: .milliseconds(300))
        #expect(collector.count == 8)
        // Two more done: five in flight, below the mark. One read hands out both waiting records.
        consumer.markDone(first[1])
        consumer.markDone(first[2])
        let all = try await collector.waitFor(count: 10, timeout: .seconds(60))
        #expect(all.map { text($0.value) } == (0..<10).map(String.init))
        collector.cancel()
        await consumer.close()
        await log.close()
    }

    @Test func withAReadIntervalAppendsKeepComingAreReadTogetherAndALoneOneAtOnce() async throws {
        // The worker and the events recorder read at most once per interval while appends keep coming, so that
        // a steady stream is read (and committed behind) in batches; a record after a quiet spell must not wait.
        let interval = Duration.seconds(2)
        let log = try await log(holding: 0)
        var options = ConsumerOptions(groupID: "interval", topics: [Self.topic], maxInFlight: 100)
        options.readInterval = interval
        let consumer = try #require(try log.consumer(options) as? EmbeddedConsumer)
        let collector = RecordCollector(consumer.records)
        func append(_ value: Int) async throws {
            _ = try await log.producer.produce([OutgoingRecord(topic: Self.topic, key: Array("k\(value)".utf8), value: Array("\(value)".utf8))])
        }
        try await append(0)
        try await collector.waitFor(count: 1)
        // A quiet spell longer than the interval: the next append is read at once, not an interval later.
        try await Task.sleep(for: interval + .milliseconds(200))
        let loneAppended = ContinuousClock.now
        let waitsBefore = consumer.intervalWaits
        try await append(1)
        try await collector.waitFor(count: 2)
        // Counted, not timed: no wait for the interval before the lone record's read.
        #expect(consumer.intervalWaits == waitsBefore, "a lone record waited for the read interval")
        let readsBefore = consumer.handingOutReads
        // Two appends right behind it: read in one pass, no sooner than an interval after the read of record 1
        // began (which was after its append).
        try await append(2)
        try await append(3)
        let all = try await collector.waitFor(count: 4)
        #expect(ContinuousClock.now - loneAppended >= interval, "records appended within the interval were read before it passed")
        #expect(consumer.handingOutReads == readsBefore + 1, "records appended within the interval were read apart")
        #expect(all.map { text($0.value) } == ["0", "1", "2", "3"])
        collector.cancel()
        await consumer.close()
        await log.close()
    }

    @Test func withAReadIntervalAPassThatLeftRecordsBehindReadsOnAtOnceWhileAppendsKeepComing() async throws {
        // After the interval a backlog is read pass after pass (64 records on the writer's connection, then 256
        // a pass), each at once: the appends that keep coming meanwhile must not make every one of those passes
        // wait out an interval of its own (the worker after an outage would drain its backlog at 256 records
        // per 4 ms, the events recorder at 256 per 50 ms).
        let interval = Duration.seconds(1)
        let backlog = 4_000
        let log = try await log(holding: 0)
        var options = ConsumerOptions(groupID: "interval-backlog", topics: [Self.topic], maxInFlight: 100_000)
        options.readInterval = interval
        let consumer = try #require(try log.consumer(options) as? EmbeddedConsumer)
        let collector = RecordCollector(consumer.records)
        func record(_ value: String) -> OutgoingRecord { OutgoingRecord(topic: Self.topic, key: Array("k-\(value)".utf8), value: Array(value.utf8)) }
        let started = ContinuousClock.now
        _ = try await log.producer.produce([record("0")])
        try await collector.waitFor(count: 1)
        // Within the interval after that read: read once it has passed, more than one pass's worth.
        _ = try await log.producer.produce((1...backlog).map { record("\($0)") })
        // Appends keep coming (one every 2 ms) while the backlog is read, so most passes begin with one pending.
        let appending = Task {
            var next = 0
            while !Task.isCancelled {
                _ = try? await log.producer.produce([record("more-\(next)")])
                next += 1
                try? await Task.sleep(for: .milliseconds(2))
            }
        }
        let records = try await collector.waitFor(count: 1 + backlog, timeout: .seconds(60))
        let elapsed = ContinuousClock.now - started
        // Counted, not timed (a slow machine must not fail it): one wait before the backlog, and once it was all
        // read the appends that keep coming are read an interval apart again, so one more for each interval
        // this test takes to look (two allowed: a second or more). With a wait before each of the backlog's
        // sixteen passes or more, it counted fifteen.
        let waits = consumer.intervalWaits
        appending.cancel()
        _ = await appending.result
        #expect(records.prefix(1 + backlog).map { text($0.value) } == (0...backlog).map(String.init))
        #expect(elapsed >= interval, "the backlog appended within the interval was read before it passed")
        #expect(consumer.handingOutReads >= 1 + backlog / 256, "the backlog was read in fewer passes than it needs")
        #expect(waits <= 3, "the backlog's passes waited out read intervals: \(waits) waits")
        collector.cancel()
        await consumer.close()
        await log.close()
    }

    @Test func closingEndsTheReadIntervalsWait() async throws {
        // A reader waiting out its interval for an append must not hold up shutdown for that interval.
        let log = try await log(holding: 0)
        let consumer = try log.consumer(ConsumerOptions(groupID: "interval-close", topics: [Self.topic], readInterval: .seconds(3_600)))
        let collector = RecordCollector(consumer.records)
        _ = try await log.producer.produce([OutgoingRecord(topic: Self.topic, key: Array("k0".utf8), value: Array("0".utf8))])
        try await collector.waitFor(count: 1)
        // Appended within the hour: the reader waits for the interval's end to read it.
        _ = try await log.producer.produce([OutgoingRecord(topic: Self.topic, key: Array("k1".utf8), value: Array("1".utf8))])
        // Closed from a task of its own: a close that waited out the hour must fail the test, not hang it.
        let closed = LockedBox(false)
        Task {
            await consumer.close()
            closed.withLock { $0 = true }
        }
        try await waitUntil("close while the reader waits out its read interval", timeout: .seconds(30)) { closed.withLock { $0 } }
        #expect(collector.count == 1)
        collector.cancel()
        await log.close()
    }

    @Test func recordsHeldBackDoNotKeepTheStoppedReaderAsleep() async throws {
        // Four partitions start with a record due in an hour, which holds them; two hold 100 records each.
        // With a bound of 5 the four held records leave room for one: the reader stops at the bound on
        // every read, and only a wake that does not count held records (no markDone frees them) goes on.
        let start: Int64 = 1_800_000_000_000
        let log = try EmbeddedRecordLog.inMemory(topics: [Self.topic], partitions: 6, consumerPollInterval: .seconds(3_600), logger: testLogger())
        var records = (0..<4).map {
            OutgoingRecord(
                topic: Self.topic, key: Array("held-\($0)".utf8), value: Array("held".utf8),
                headers: [RecordHeader(name: "due", value: "\(start + 3_600_000)")], partition: Int32($0))
        }
        records += (0..<200).map { OutgoingRecord(topic: Self.topic, key: Array("k\($0)".utf8), value: Array("\($0)".utf8), partition: Int32(4 + $0 % 2)) }
        _ = try await log.producer.produce(records)
        var options = ConsumerOptions(
            groupID: "held", topics: [Self.topic], maxInFlight: 5,
            dueTime: { record in record.headers.first(named: "due")?.stringValue.flatMap { Int64($0) } })
        options.now = { start }
        let consumer = try log.consumer(options)
        let received = try await withThrowingTaskGroup(of: [String].self) { group in
            group.addTask {
                var values: [String] = []
                for await record in consumer.records {
                    values.append(text(record.value))
                    consumer.markDone(record)
                    if values.count == 200 { break }
                }
                return values
            }
            group.addTask {
                try await Task.sleep(for: .seconds(60))
                throw TestTimeout(what: "200 records beside 4 held ones")
            }
            defer { group.cancelAll() }
            return try await group.next() ?? []
        }
        #expect(received.count == 200)
        #expect(!received.contains("held"))
        #expect(Set(received) == Set((0..<200).map(String.init)))
        await consumer.close()
        await log.close()
    }
}

private final class Counts: Sendable {
    let started = Atomic(0)
    /// Counted before each markDone: records received less these are at most what the consumer counts in flight.
    let finished = Atomic(0)
    let mostOutstanding = Atomic(0)
}

private struct TestTimeout: Error, CustomStringConvertible {
    var what: String
    var description: String { "timed out waiting for \(what)" }
}
