import ArgumentParser
import Foundation
import RelayBackend
import RelayCore

/// `revenue-relay deliveries`: the delivery log (every webhook attempt), newest first, from the backend's
/// deliveries route: one line per attempt, or its JSON.
struct Deliveries: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List webhook attempts from the delivery log, newest first (endpoint, event, attempt, outcome, HTTP status, time).",
        discussion: """
            Reads GET /subscriptions-api/internal/v1/deliveries with backend.apiKey (a read key reads its apps' \
            attempts). Each line: the time the attempt finished, the endpoint, the event's id and type, the \
            attempt's number, its outcome (succeeded, retrying, dead), the HTTP status and the error. Exit 0: \
            done; 64: bad arguments; 69: the backend unreachable; 78: bad configuration.
            """)

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case table
        case jsonl
    }

    @OptionGroup var backend: BackendOptions

    @Option(help: "Only this app key.")
    var app: String?

    @Option(help: "Only this endpoint id.")
    var endpoint: String?

    @Option(name: .customLong("event-id"), help: "Only the attempts of this event (its data.id): its timeline.")
    var eventId: String?

    @Option(name: [.customLong("app-user-id"), .customLong("user")], help: "Only the attempts of this app user's events.")
    var appUserId: String?

    @Option(help: "succeeded, retrying or dead.")
    var status: String?

    @Option(help: "Attempts finished at or after this time: a date, an RFC 3339 time or Unix milliseconds.")
    var since: String?

    @Option(help: "Attempts finished before this time.")
    var until: String?

    @Option(help: "At most this many attempts (default 100).")
    var limit: Int = 100

    @Option(help: "table or jsonl.")
    var format: Format = .table

    func validate() throws {
        guard limit > 0 else { throw ValidationError("--limit must be at least 1") }
        if let status, DeliveryAttempt.Outcome(rawValue: status) == nil { throw ValidationError("--status must be succeeded, retrying or dead") }
    }

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let filter = [("app", app), ("endpoint", endpoint), ("eventId", eventId), ("appUserId", appUserId), ("status", status), ("since", since), ("until", until)]
            .compactMap { name, value in value.map { (name, $0) } }
        var attempts: [JSON] = []
        let limit = limit
        try await reading(reader) { (client) async throws(BackendError) in
            var cursor: String?
            repeat {
                var query = filter + [("limit", String(min(1_000, limit - attempts.count)))]
                if let cursor { query.append(("cursor", cursor)) }
                let page = try await client.read("/subscriptions-api/internal/v1/deliveries", query)
                attempts += page["deliveries"]?.arrayValue ?? []
                cursor = page["nextCursor"]?.stringValue
            } while cursor != nil && attempts.count < limit
        }
        for attempt in attempts {
            switch format {
            case .jsonl:
                printLine(attempt.text)
            case .table:
                let time = attempt["finishedAt"]?.int64Value.map { Timestamp.rfc3339(milliseconds: $0) } ?? "-"
                let status = attempt["httpStatus"]?.int64Value.map(String.init) ?? "-"
                var line = "\(time)  \(attempt["endpoint"]?.stringValue ?? "-")  \(attempt["eventId"]?.stringValue ?? "-")"
                line += "  \(attempt["eventType"]?.stringValue ?? "-")  attempt=\(attempt["attempt"]?.int64Value ?? 0)"
                line += "  \(attempt["outcome"]?.stringValue ?? "-")  http=\(status)"
                if let replayed = attempt["replayedFrom"]?.stringValue { line += "  replayed-from=\(replayed)" }
                if let error = attempt["error"]?.stringValue { line += "  error=\(error)" }
                printLine(line)
            }
        }
    }
}
