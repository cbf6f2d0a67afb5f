import ArgumentParser
import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayDelivery

/// Where a log tool reads: the embedded log's data directory, or Kafka.
struct LogLocation: ParsableArguments {
    @Option(help: "Configuration file.")
    var config: String

    @Option(name: .customLong("bootstrap-servers"), help: "Kafka brokers (overrides kafka.bootstrapServers).")
    var bootstrapServers: String?

    @Option(help: "The embedded log's data directory (overrides log.path).")
    var data: String?

    func validate() throws {
        if bootstrapServers != nil, data != nil { throw ValidationError("give --bootstrap-servers (Kafka) or --data (the embedded log), not both") }
    }

    func open(clientID: String) throws -> (RelayConfiguration, any RecordLog) {
        let configuration = try loadConfiguration(config)
        return (configuration, try openLog(configuration, clientID: clientID))
    }

    /// The log, or exit 69 saying why it cannot be opened.
    func openLog(_ configuration: RelayConfiguration, clientID: String) throws -> any RecordLog {
        var logger = Logger(label: "revenue-relay")
        logger.logLevel = .error
        do {
            return try ToolLog.open(configuration: configuration, bootstrapServers: bootstrapServers, dataDirectory: data, clientID: clientID, logger: logger)
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw Exit.unavailable
        }
    }
}

/// `revenue-relay tail TOPIC` (docs/contracts.md, Command line): a topic's records as JSON lines, on either log.
struct Tail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a topic's records as JSON lines, on either log (also while the process that owns the embedded log runs).",
        discussion: """
            Each line is {"topic", "partition", "offset", "timestamp", "key", "headers": {...}, "value"}: the value \\
            as JSON when it is JSON, else base64 in "valueBase64" (a key or header value that is not UTF-8 is \\
            base64 too, in "keyBase64", or prefixed "base64:"). Without --from-beginning it starts at the last 10 \\
            records of each partition. --follow keeps printing appends as they come until interrupted. Exit 0: \\
            done; 64: bad arguments; 69: the log unreachable or no such topic; 78: bad configuration.
            """
    )

    @Argument(help: "The topic (relay.notifications, relay.deliveries.dlq, ...).")
    var topic: String

    @OptionGroup var location: LogLocation

    @Flag(help: "Start at each partition's oldest record.")
    var fromBeginning = false

    @Flag(help: "Keep printing records as they are appended.")
    var follow = false

    @Option(help: "Print at most this many records, then stop.")
    var limit: Int?

    func run() async throws {
        bootstrapLogging(defaultLevel: .error)
        if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
        let (_, log) = try location.open(clientID: "revenue-relay-tail")
        var printed = 0
        do {
            var starts: [Int32: Int64] = [:]
            if !fromBeginning {
                for end in try log.partitionEnds(of: topic) { starts[end.partition] = max(end.startOffset, end.endOffset - 10) }
            }
            let reader = try log.read(topic, from: starts, follow: follow)
            for try await record in reader.records {
                printLine(Self.line(record).text)
                printed += 1
                if let limit, printed >= limit { break }
            }
            await reader.close()
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: cannot read \(topic): \(error)\n".utf8))
            await log.close()
            throw Exit.unavailable
        }
        await log.close()
    }

    /// One record as the JSON line `tail` prints.
    static func line(_ record: ConsumedRecord) -> JSON {
        var object: [String: JSON] = [
            "topic": .string(record.topic), "partition": .integer(Int64(record.partition)), "offset": .integer(record.offset),
            "timestamp": record.timestampMilliseconds.map(JSON.integer) ?? .null,
        ]
        if let key = record.key {
            if let text = String(validating: key, as: UTF8.self) { object["key"] = .string(text) } else { object["keyBase64"] = .string(Base64.encode(key)) }
        } else {
            object["key"] = .null
        }
        var headers: [String: JSON] = [:]
        for header in record.headers where headers[header.name] == nil {
            headers[header.name] = .string(header.stringValue ?? "base64:" + Base64.encode(header.value))
        }
        object["headers"] = .object(headers)
        if let value = try? JSON.parse(record.value) {
            object["value"] = value
        } else {
            object["valueBase64"] = .string(Base64.encode(record.value))
        }
        return .object(object)
    }
}

/// `revenue-relay topics` (docs/contracts.md, Command line): each topic's partitions and end offsets, and each consumer
/// group's lag, on either log.
struct Topics: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show each topic with its partitions and end offsets, and each consumer group's lag, on either log.",
        discussion: """
            Lag is the records between where a group goes on and the partition's end: relay-worker on the \\
            notifications topic, relay-deliverer on the deliveries and retry topics, relay-backend on the events \\
            and the delivery log's attempts topics. A group that stored nothing \\
            yet counts from the oldest record kept. Exit 0: done; 69: the log unreachable; 78: bad configuration.
            """
    )

    @OptionGroup var location: LogLocation

    @Flag(help: "Print one JSON object instead of text.")
    var json = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .error)
        let (configuration, log) = try location.open(clientID: "revenue-relay-topics")
        let topics = configuration.topics
        let groups = Dictionary(uniqueKeysWithValues: configuration.consumerGroups.map { ($0.group, $0.topics) })
        var report: [JSON] = []
        do {
            for topic in topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
                let ends = try log.partitionEnds(of: topic)
                var groupReports: [JSON] = []
                for (group, read) in groups.sorted(by: { $0.key < $1.key }) where read.contains(topic) {
                    let committed = try log.committedOffsets(group: group, topic: topic)
                    let lags = ends.map { end in (end.partition, max(0, end.endOffset - max(committed[end.partition] ?? end.startOffset, end.startOffset))) }
                    groupReports.append([
                        "group": .string(group), "lag": .integer(lags.reduce(0) { $0 + $1.1 }),
                        "partitions": .array(lags.map { ["partition": .integer(Int64($0.0)), "committed": committed[$0.0].map(JSON.integer) ?? .null, "lag": .integer($0.1)] }),
                    ])
                }
                report.append([
                    "topic": .string(topic), "records": .integer(ends.reduce(0) { $0 + $1.endOffset - $1.startOffset }),
                    "partitions": .array(ends.map { ["partition": .integer(Int64($0.partition)), "start": .integer($0.startOffset), "end": .integer($0.endOffset)] }),
                    "groups": .array(groupReports),
                ])
            }
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            await log.close()
            throw Exit.unavailable
        }
        await log.close()
        if json {
            printLine(JSON.object(["topics": .array(report)]).text)
            return
        }
        for topic in report {
            let partitions = topic["partitions"]?.arrayValue ?? []
            let ends = partitions.map { "\($0["partition"]?.text ?? "?"):\($0["end"]?.text ?? "?")" }.joined(separator: " ")
            printLine("\(topic["topic"]?.stringValue ?? "")  partitions=\(partitions.count)  records=\(topic["records"]?.text ?? "0")  end offsets \(ends)")
            for group in topic["groups"]?.arrayValue ?? [] {
                printLine("  group \(group["group"]?.stringValue ?? "")  lag=\(group["lag"]?.text ?? "0")")
            }
        }
    }
}

/// `revenue-relay copy`: moving up from the embedded log to Kafka (docs/architecture.md, "Moving up to Kafka").
struct Copy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy what the embedded log has not finished (and its dead letters) to Kafka, to move a stopped relay up to a cluster.",
        discussion: """
            Stop the relay first (it owns the data directory; the copy refuses to run beside it). Copies the \
            notifications after relay-worker's offsets, the deliveries and retry topics after \
            relay-deliverer's, the events and the delivery log's attempts after relay-backend's, and the dead-letter topic and replay ledger \
            whole; --history also copies the events and rejected topics whole. The Kafka topics must exist. Then set log.kind: kafka and run. \
            Exit 0: done; 69: the log in use, or Kafka unreachable; 78: bad configuration.
            """
    )

    @Option(help: "Configuration file.")
    var config: String

    @Option(help: "The embedded log's data directory (default: log.path).")
    var data: String?

    @Option(name: .customLong("bootstrap-servers"), help: "Kafka brokers to copy to (default: kafka.bootstrapServers).")
    var bootstrapServers: String?

    @Flag(help: "Also copy the events and rejected topics whole.")
    var history = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .error)
        let configuration = try loadConfiguration(config)
        var logger = Logger(label: "revenue-relay")
        logger.logLevel = .error
        let destination = try ToolLog.open(
            configuration: configuration, bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, dataDirectory: nil,
            clientID: "revenue-relay-copy", logger: logger)
        do {
            let summaries = try await CopyCommand.run(
                configuration: configuration, from: data ?? configuration.log.path, to: destination, history: history, logger: logger,
                progress: { topic, copied in FileHandle.standardError.write(Data("\(topic): \(copied)\n".utf8)) })
            for summary in summaries {
                printLine("\(summary.topic): copied \(summary.copied)" + (summary.skipped > 0 ? ", \(summary.skipped) already finished" : ""))
            }
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: copy stopped: \(error); what was copied is in Kafka, run it again only after emptying those topics\n".utf8))
            throw Exit.unavailable
        }
    }
}
