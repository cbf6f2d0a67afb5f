import Foundation
import RelayCore
import RelayEmbeddedLog
import RelayTestSupport
import Testing

/// What only the embedded log does: survive being killed, one owner per data directory, retention and
/// compaction.
@Suite struct EmbeddedLogTests {
    static var bench: URL? {
        let candidates = [
            Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("revenue-relay-bench"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("revenue-relay-bench"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("revenue-relay-bench"),
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) }
    }

    static func directory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("embedded-log")).path
    }

    /// A child appends (8 concurrent producers) and consumes, and is killed with SIGKILL at a random point,
    /// three times over. Afterwards every acknowledged append is in the log exactly once (and nothing is
    /// there twice), and a consumer of the same group gets every record that was never marked done.
    @Test func killedAtRandomPointsItLosesNoAcknowledgedAppendAndRedeliversWhatWasNotDone() async throws {
        let bench = try #require(Self.bench, "the revenue-relay-bench executable was not built next to the tests")
        let directory = Self.directory()
        let topic = "crash.records"
        let group = "crash-group"
        var acknowledged = Set<String>()
        var done = Set<String>()
        for round in 0..<3 {
            let result = try await runChildProcess(
                bench,
                [
                    "log-crash-child", "--data", directory, "--topic", topic, "--group", group, "--start", "\(round * 10_000_000)",
                    "--die-after-ms", "\(Int.random(in: 300...1200))",
                ])
            #expect(result.status == 128 + SIGKILL, "round \(round) ended by SIGKILL: \(result.stderr)")
            for line in result.stdoutText.split(separator: "\n") {
                let parts = line.split(separator: " ")
                guard parts.count == 2 else { continue }
                if parts[0] == "a" { acknowledged.insert(String(parts[1])) }
                if parts[0] == "d" { done.insert(String(parts[1])) }
            }
            #expect(!acknowledged.isEmpty && !done.isEmpty, "round \(round) appended and consumed")
        }

        let log = try EmbeddedRecordLog(directory: directory, topics: [topic], partitions: 3, logger: testLogger())
        var counts: [String: Int] = [:]
        let snapshot = try log.snapshot(of: topic)
        for try await record in snapshot.records { counts[text(record.value), default: 0] += 1 }
        let lost = acknowledged.subtracting(counts.keys)
        #expect(lost.isEmpty, "\(lost.count) of \(acknowledged.count) acknowledged appends missing, e.g. \(lost.sorted().prefix(5))")
        let twice = counts.filter { $0.value > 1 }.keys
        #expect(twice.isEmpty, "\(twice.count) records stored more than once, e.g. \(twice.sorted().prefix(5))")

        let unfinished = Set(counts.keys).subtracting(done)
        #expect(unfinished.count < counts.count, "some records were done and are not expected again")
        let consumer = try log.consumer(ConsumerOptions(groupID: group, topics: [topic], maxInFlight: 10_000_000))
        let collector = RecordCollector(consumer.records)
        try await waitUntil("every record not marked done, again") { unfinished.isSubset(of: Set(collector.records.map { text($0.value) })) }
        await consumer.close()
        await log.close()
    }

    @Test func commitsAreSyncedToDiskAndAConsumerClosesTwiceWithoutHanging() async throws {
        let log = try EmbeddedRecordLog(directory: Self.directory(), topics: ["t"], partitions: 1, logger: testLogger())
        // GRDB sets the writer to NORMAL with WAL; an acknowledged append must survive power loss.
        #expect(try log.commitsAreSynced())
        let unused = try log.consumer(ConsumerOptions(groupID: "g", topics: ["t"]))
        await unused.close()
        await unused.close()
        let used = try log.consumer(ConsumerOptions(groupID: "g", topics: ["t"]))
        _ = used.records
        await used.close()
        await used.close()
        await log.close()
    }

    /// `log.commitInterval`: appends that come sooner than the interval after a commit started wait for the rest
    /// of it and share one commit, each in the log.
    @Test func appendsSoonerThanTheCommitIntervalWaitForItAndShareOneCommit() async throws {
        let metrics = TestMetrics()
        let interval = Duration.seconds(1)
        let log = try EmbeddedRecordLog(directory: Self.directory(), topics: ["t"], partitions: 1, commitInterval: interval, logger: testLogger(), metrics: metrics)
        let producer = try log.producer
        let clock = ContinuousClock()
        // Before the first append: its commit starts after this, and the next may not start within the interval.
        let start = clock.now
        _ = try await producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("first".utf8)))
        #expect(metrics.value(of: "relay_log_commits_total", []) == 1)
        // Twenty callers at once, each its own call (the writer never splits one call's records anyway).
        let positions = try await withThrowingTaskGroup(of: RecordPosition.self) { group in
            for index in 0..<20 { group.addTask { try await producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("\(index)".utf8))) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(clock.now - start >= interval)
        #expect(metrics.value(of: "relay_log_commits_total", []) == 2)
        #expect(metrics.value(of: "relay_log_appended_total", []) == 21)
        #expect(Set(positions.map(\.offset)) == Set(1...20))
        await log.close()
    }

    /// A 90 s interval: the first append to a fresh log is not held back by it, and closing the log ends the wait
    /// of an append made right after it (either would otherwise run past the one-minute time limit).
    @Test(.timeLimit(.minutes(1))) func anAppendToAnIdleLogIsCommittedAtOnceAndClosingEndsTheWait() async throws {
        let log = try EmbeddedRecordLog(directory: Self.directory(), topics: ["t"], partitions: 1, commitInterval: .seconds(90), logger: testLogger())
        let producer = try log.producer
        let position = try await producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("alone".utf8)))
        #expect(position.offset == 0)
        let waiting = Task { try await producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("next".utf8))) }
        // Time for the append to be queued: the writer then waits for the 90 s to pass, or for `close`.
        try await Task.sleep(for: .milliseconds(200))
        await log.close()
        // Queued before the close, it is committed; had it come after, it would be refused as closed.
        switch await waiting.result {
        case .success(let next): #expect(next.offset == 1)
        case .failure(let error): #expect((error as? RecordLogError)?.code == .closed, "\(error)")
        }
    }

    @Test func aSecondOwnerOfTheDataDirectoryFailsAtOnceNamingIt() async throws {
        let directory = Self.directory()
        let owner = try EmbeddedRecordLog(directory: directory, topics: ["t"], partitions: 1, logger: testLogger())
        #expect {
            _ = try EmbeddedRecordLog(directory: directory, topics: ["t"], partitions: 1, logger: testLogger())
        } throws: { error in
            "\(error)".contains(directory) && "\(error)".contains("in use by another revenue-relay process")
        }
        // Tools read and append while the owner runs, but do not consume.
        let tool = try EmbeddedRecordLog(directory: directory, topics: ["t"], partitions: 1, owner: false, logger: testLogger())
        _ = try await tool.producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("from a tool".utf8)))
        #expect(throws: RecordLogError.self) { _ = try tool.consumer(ConsumerOptions(groupID: "g", topics: ["t"])) }
        let consumer = try owner.consumer(ConsumerOptions(groupID: "g", topics: ["t"]))
        let collector = RecordCollector(consumer.records)
        try await collector.waitFor(count: 1)
        #expect(text(collector.records[0].value) == "from a tool")
        await consumer.close()
        await tool.close()
        await owner.close()
    }

    @Test func retentionRemovesOldRecordsAndCompactionKeepsTheNewestPerKey() async throws {
        let directory = Self.directory()
        let log = try EmbeddedRecordLog(
            directory: directory, topics: ["events", "dead", "ledger"], partitions: 1, compacted: ["ledger"], keptByAge: ["dead", "ledger"],
            logger: testLogger())
        let producer = try log.producer
        for index in 0..<5 {
            for topic in ["events", "dead"] { _ = try await producer.produce(OutgoingRecord(topic: topic, key: nil, value: Array("\(index)".utf8))) }
            _ = try await producer.produce(OutgoingRecord(topic: "ledger", key: Array("position-\(index % 2)".utf8), value: Array("\(index)".utf8)))
        }
        // Everything is older than a retention of one millisecond, an hour from now.
        log.runHousekeeping(retention: .milliseconds(1), retentionBytes: 1 << 30, now: wallClockMilliseconds() + 3_600_000)
        func values(_ topic: String) async throws -> [String] {
            var values: [String] = []
            for try await record in try log.snapshot(of: topic).records { values.append(text(record.value)) }
            return values
        }
        #expect(try await values("events") == [], "past its retention")
        #expect(try await values("dead") == ["0", "1", "2", "3", "4"], "dead letters are not removed by age")
        #expect(try await values("ledger") == ["3", "4"], "the newest record per key")
        // Offsets go on from where they were, and a group reads from the oldest record kept.
        let next = try await producer.produce(OutgoingRecord(topic: "events", key: nil, value: Array("5".utf8)))
        #expect(next.offset == 5)
        let consumer = try log.consumer(ConsumerOptions(groupID: "late", topics: ["events"]))
        let collector = RecordCollector(consumer.records)
        try await collector.waitFor(count: 1)
        #expect(collector.records.map { text($0.value) } == ["5"])
        // The size bound removes the oldest first.
        for index in 0..<4 { _ = try await producer.produce(OutgoingRecord(topic: "dead", key: nil, value: [UInt8](repeating: UInt8(index), count: 400_000))) }
        log.runHousekeeping(retention: .seconds(3600), retentionBytes: 1_000_000)
        let ends = try #require(try log.partitionEnds(of: "dead").first)
        #expect(ends.endOffset == 9)
        #expect(ends.startOffset == 7, "two records of 400 kB stay under 1 MB")
        await consumer.close()
        await log.close()
    }
}
