import ArgumentParser
import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayDelivery

/// `revenue-relay replay` (docs/contracts.md, Command line): re-delivers dead-lettered webhooks that match.
struct Replay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Re-deliver dead-lettered webhooks that match; show progress; print a summary.",
        discussion: """
            Reads the dead-letter topic from its start to its current end and re-produces each matching \
            delivery to the deliveries topic with the same webhook-id and a fresh attempt count. What was \
            re-driven is recorded in the replay ledger topic, so running the same replay again re-drives \
            nothing twice. Times are ISO 8601 (2026-11-20T08:00:00Z, or a date: 2026-11-20) and compare \
            with the time each delivery was dead-lettered. Works on either log: Kafka (--bootstrap-servers, \
            else kafka.bootstrapServers) or the embedded log (--data DIR, else log.path when log.kind is \
            embedded), also while the process that owns it runs. Exit 0: done; 64: bad arguments; 69: the log \
            unreachable or a topic missing; 78: bad configuration.
            """
    )

    @OptionGroup var location: LogLocation

    @Option(help: "Only this endpoint id.")
    var endpoint: String?

    @Option(help: "Only this event type (renewal, cancellation, ...).")
    var type: String?

    @Option(help: "Only deliveries dead-lettered at or after this time.")
    var since: String?

    @Option(help: "Only deliveries dead-lettered before this time.")
    var until: String?

    @Option(help: "Re-drive at most this many.")
    var limit: Int?

    @Option(help: "Re-drives per second at most.")
    var rate: Double = 100

    @Flag(help: "List what would be re-driven; change nothing.")
    var dryRun = false

    static func time(_ text: String?, option: String) throws -> Int64? {
        guard let text else { return nil }
        guard let milliseconds = Timestamp.milliseconds(dateOrTime: text) else {
            throw ValidationError("--\(option) must be an ISO 8601 time such as 2026-11-20T08:00:00Z or a date such as 2026-11-20")
        }
        return milliseconds
    }

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try Self.time(since, option: "since")
        let until = try Self.time(until, option: "until")
        guard rate > 0, rate.isFinite else { throw ValidationError("--rate must be a positive number of re-drives per second") }
        if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
        let configuration = try loadConfiguration(location.config)
        if let endpoint, !configuration.endpoints.contains(where: { $0.id == endpoint }) {
            throw ValidationError(
                "no endpoint with id \(endpoint) in \(location.config); endpoints are \(configuration.endpoints.map(\.id).joined(separator: ", "))")
        }
        let log = try location.openLog(configuration, clientID: "revenue-relay-replay")
        let filter = ReplayFilter(endpoint: endpoint, type: type, since: since, until: until, limit: limit)
        let bar = ProgressBar(enabled: isatty(STDERR_FILENO) == 1)
        let dryRun = dryRun
        let summary: ReplaySummary
        do {
            summary = try await ReplayCommand.run(
                configuration: configuration, log: log, filter: filter, rate: rate, dryRun: dryRun,
                progress: { summary, expected in bar.update(summary, expected: expected) },
                candidate: { candidate in
                    guard dryRun else { return }
                    bar.clear()
                    printLine(Self.describe(candidate))
                })
        } catch {
            bar.finish()
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw Exit.unavailable
        }
        bar.finish()
        printLine("matched: \(summary.matched)")
        printLine("\(dryRun ? "would re-drive" : "re-driven"): \(summary.redriven)")
        printLine("skipped: \(summary.skipped) (already replayed: \(summary.alreadyReplayed), duplicates in this run: \(summary.duplicates))")
    }

    static func describe(_ candidate: ReplayCandidate) -> String {
        let delivery = candidate.delivery
        var fields = [
            candidate.position, "endpoint=\(delivery.endpointID)", "type=\(delivery.eventType)", "id=\(delivery.eventID)",
            "attempts=\(delivery.attempts)",
        ]
        if let at = candidate.deadLetteredAt { fields.append("dead-lettered=\(Timestamp.rfc3339(milliseconds: at))") }
        if let reason = delivery.deadLetterReason { fields.append("reason=\(reason)") }
        if let error = delivery.lastError { fields.append("last=\"\(error)\"") }
        return fields.joined(separator: "  ")
    }
}

/// A one-line progress bar on stderr when it is a terminal, redrawn at most ten times a second.
final class ProgressBar: @unchecked Sendable {
    private let enabled: Bool
    private var lastDraw = ContinuousClock.now - .seconds(1)
    private var drawn = false

    init(enabled: Bool) { self.enabled = enabled }

    func update(_ summary: ReplaySummary, expected: Int64) {
        guard enabled, ContinuousClock.now - lastDraw >= .milliseconds(100) else { return }
        lastDraw = .now
        let total = max(expected, Int64(summary.scanned))
        let fraction = total == 0 ? 1 : Double(summary.scanned) / Double(total)
        let width = 30
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let line = "replay [\(bar)] \(summary.scanned)/\(total) read · \(summary.matched) matched · \(summary.redriven) re-driven · \(summary.skipped) skipped"
        FileHandle.standardError.write(Data("\r\u{1B}[K\(line)".utf8))
        drawn = true
    }

    func clear() {
        guard enabled, drawn else { return }
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
        drawn = false
        lastDraw = .now - .seconds(1)
    }

    func finish() {
        guard enabled, drawn else { return }
        FileHandle.standardError.write(Data("\n".utf8))
        drawn = false
    }
}
