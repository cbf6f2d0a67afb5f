import ArgumentParser
import Foundation
import Glibc
import Logging
import RelayCore
import RelayEmbeddedLog
import RelayKafka
import Synchronization

/// An atomic count shared with escaping closures.
final class SharedCount: Sendable {
    let value = Atomic<Int>(0)
}

/// Appends and consumption of the record log: the embedded log (durable, synchronous=FULL) and
/// librdkafka's mock cluster in the same run, with many concurrent producers of notification-sized records.
struct LogBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log", abstract: "Appends/s and consumed records/s of the embedded log and the mock Kafka cluster.")

    @Option(help: "Concurrent producers.")
    var producers = 64

    @Option(help: "The embedded log's log.commitInterval in milliseconds (the relay's default: 5; 0: commit whenever anything waits).")
    var commitIntervalMs = 5

    @Option(help: "Records appended in all.")
    var records = 20_000

    @Option(help: "Bytes per record value (an Apple notification is about 15 KB).")
    var size = 15_000

    @Option(help: "Where the embedded log's data directory goes (a fresh folder inside it).")
    var directory = FileManager.default.temporaryDirectory.path

    func run() async throws {
        var logger = Logger(label: "bench")
        logger.logLevel = .error
        let topic = "bench.records"
        let dataDirectory = directory + "/relay-log-bench-\(UUID().uuidString.prefix(8))"
        let embedded = try EmbeddedRecordLog(
            directory: dataDirectory, topics: [topic], partitions: 6, commitInterval: .milliseconds(commitIntervalMs), logger: logger)
        line("\(producers) producers, \(records) records of \(size) bytes, \(ProcessInfo.processInfo.activeProcessorCount) cores")
        line("| log | appends/s | consumed records/s |")
        line("| --- | ---: | ---: |")
        let (embeddedAppends, embeddedConsumed) = try await measure(embedded, topic: topic, records: records)
        line("| embedded (SQLite, WAL, synchronous=FULL, commitInterval \(commitIntervalMs) ms) | \(Int(embeddedAppends)) | \(Int(embeddedConsumed)) |")
        await embedded.close()
        try? FileManager.default.removeItem(atPath: dataDirectory)

        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: logger)
        try cluster.createTopic(topic, partitions: 6)
        let kafka = KafkaRecordLog(
            configuration: KafkaConfiguration(
                bootstrapServers: cluster.bootstrapServers, properties: ["fetch.wait.max.ms": "10", "session.timeout.ms": "6000"]),
            logger: logger)
        // The mock cluster keeps about 5 MiB per partition and drops the oldest: only what it keeps can be consumed.
        let kafkaRecords = min(records, 6 * 4 * 1024 * 1024 / max(size, 1) / producers * producers)
        let (kafkaAppends, kafkaConsumed) = try await measure(kafka, topic: topic, records: kafkaRecords)
        line("| Kafka protocol (librdkafka mock cluster, in memory, acks=all; \(kafkaRecords) records) | \(Int(kafkaAppends)) | \(Int(kafkaConsumed)) |")
        await kafka.close()
    }

    /// One line on stdout at once (print is block-buffered into a pipe).
    func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    func measure(_ log: any RecordLog, topic: String, records: Int) async throws -> (appends: Double, consumed: Double) {
        let producer = try log.producer
        let value = [UInt8](repeating: UInt8(ascii: "x"), count: size)
        let start = ContinuousClock.now
        let perProducer = records / producers
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<producers {
                group.addTask {
                    for sequence in 0..<perProducer {
                        _ = try await producer.produce(
                            OutgoingRecord(topic: topic, key: Array("key-\(index)-\(sequence % 97)".utf8), value: value))
                    }
                }
            }
            try await group.waitForAll()
        }
        let appended = perProducer * producers
        let appendSeconds = (ContinuousClock.now - start) / .seconds(1)

        let consumer = try log.consumer(ConsumerOptions(groupID: "bench-\(UUID().uuidString.prefix(6))", topics: [topic], maxInFlight: 4096))
        let count = SharedCount()
        let consumeStart = ContinuousClock.now
        let task = Task {
            await consumer.consume { record in
                consumer.markDone(record)
                count.value.add(1, ordering: .relaxed)
            }
        }
        while count.value.load(ordering: .relaxed) < appended { try await Task.sleep(for: .milliseconds(5)) }
        let consumeSeconds = (ContinuousClock.now - consumeStart) / .seconds(1)
        task.cancel()
        await task.value
        await consumer.close()
        return (Double(appended) / appendSeconds, Double(appended) / consumeSeconds)
    }
}

/// For the embedded log's crash test (not a benchmark): appends and consumes on a data directory,
/// printing `a <value>` once an append is acknowledged and `d <value>` once a record is marked done, and
/// kills itself with SIGKILL after `--die-after-ms` milliseconds, wherever its threads are then.
struct LogCrashChild: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "log-crash-child", abstract: "Crash-test child of the embedded log.")

    @Option var data: String
    @Option var topic: String
    @Option var group: String
    @Option(help: "The first value appended (values are unique across runs).") var start: Int
    @Option(help: "SIGKILL after this many milliseconds.") var dieAfterMs: Int

    func run() async throws {
        var logger = Logger(label: "crash-child")
        logger.logLevel = .error
        let log = try EmbeddedRecordLog(directory: data, topics: [topic], partitions: 3, logger: logger)
        let output = FileHandle.standardOutput
        let consumer = try log.consumer(ConsumerOptions(groupID: group, topics: [topic], maxInFlight: 1_000_000))
        let consuming = Task {
            await consumer.consume { record in
                // Every 13th value stays unfinished: everything behind it on its partition is redelivered.
                let value = String(decoding: record.value, as: UTF8.self)
                guard (Int(value) ?? 0) % 13 != 0 else { return }
                // Reported before it is marked: a kill in between leaves a record reported done that may come
                // again (allowed), never one marked done that the test expects again.
                output.write(Data("d \(value)\n".utf8))
                consumer.markDone(record)
            }
        }
        let producer = try log.producer
        let dieAfterMs = dieAfterMs
        startDedicatedThread(named: "killer") {
            Thread.sleep(forTimeInterval: Double(dieAfterMs) / 1000)
            kill(getpid(), SIGKILL)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for lane in 0..<8 {
                group.addTask {
                    var value = start + lane
                    while true {
                        _ = try await producer.produce(OutgoingRecord(topic: topic, key: Array("key-\(value % 17)".utf8), value: Array("\(value)".utf8)))
                        output.write(Data("a \(value)\n".utf8))
                        value += 8
                    }
                }
            }
            try await group.waitForAll()
        }
        consuming.cancel()
    }
}
