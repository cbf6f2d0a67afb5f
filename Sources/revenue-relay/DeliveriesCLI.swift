import ArgumentParser
import Foundation
import RelayApp
import RelayBackend
import RelayCore

/// `revenue-relay deliveries`: the delivery log (`list`, the default) and `resend`.
struct Deliveries: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The delivery log: list webhook attempts (the default), or resend one.",
        subcommands: [DeliveriesList.self, DeliveriesResend.self], defaultSubcommand: DeliveriesList.self)
}

/// `revenue-relay deliveries [list]`: the delivery log (every webhook attempt), newest first, from the backend's
/// deliveries route: one line per attempt, or its JSON.
struct DeliveriesList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List webhook attempts from the delivery log, newest first (endpoint, event, attempt, outcome, HTTP status, time).",
        discussion: """
            Reads GET /subscriptions-api/internal/v1/deliveries with backend.apiKey (a read key reads its apps' \
            attempts). Each line: the time the attempt finished, the endpoint, the event's id and type, the \
            attempt's number, its outcome (succeeded, retrying, throttled, dead), the HTTP status, the error and the \
            attempt's id (for `deliveries resend`). Exit 0: \
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

    @Option(help: "succeeded, retrying, throttled or dead.")
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
        if let status, DeliveryAttempt.Outcome(rawValue: status) == nil { throw ValidationError("--status must be succeeded, retrying, throttled or dead") }
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
                if let id = attempt["id"]?.stringValue { line += "  id=\(id)" }
                printLine(line)
            }
        }
    }
}

/// `revenue-relay deliveries resend <id>`: sends a recorded attempt's event to its endpoint again.
struct DeliveriesResend: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resend",
        abstract: "Send the event of one recorded attempt to its endpoint again (same webhook-id).",
        discussion: """
            Calls POST /subscriptions-api/internal/v1/deliveries/{id}/resend with backend.apiKey (the secret key; a read \
            key is refused). The id is an attempt's id from `deliveries` (id=...) or the deliveries route. The event goes \
            to its endpoint as a new delivery, marked replayed, so it passes an open circuit breaker and a 410; its \
            attempts show in the delivery log. Exit 0: accepted; 64: bad arguments; 69: the backend unreachable; 78: \
            bad configuration or a refused key.
            """)

    @OptionGroup var backend: BackendOptions

    @Argument(help: "The attempt's id.")
    var id: String

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let path = "/subscriptions-api/internal/v1/deliveries/\(PercentEncoding.pathSegment(id))/resend"
        let answer = try await reading(reader) { (client) async throws(BackendError) in try await client.act(path) }
        printLine(answer.text)
    }
}

/// `revenue-relay endpoints`: each endpoint's health (`list`, the default), `enable` and `recover`.
struct Endpoints: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Webhook endpoints: their health (the default), enable one after a 410, or recover a time range's failures.",
        subcommands: [EndpointsList.self, EndpointsEnable.self, EndpointsRecover.self], defaultSubcommand: EndpointsList.self)
}

struct EndpointsList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Each endpoint's health: success rate and latency over 1 h and 24 h, breaker, 410, pause, backlog and last failure.",
        discussion: """
            Reads GET /subscriptions-api/internal/v1/endpoints with backend.apiKey (a read key sees its apps' endpoints). \
            Exit 0: done; 69: the backend unreachable; 78: bad configuration or a refused key.
            """)

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case table
        case json
    }

    @OptionGroup var backend: BackendOptions

    @Option(help: "Only this app key's endpoints.")
    var app: String?

    @Option(help: "table or json.")
    var format: Format = .table

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let query = app.map { [("app", $0)] } ?? []
        let answer = try await reading(reader) { (client) async throws(BackendError) in
            try await client.read("/subscriptions-api/internal/v1/endpoints", query)
        }
        if format == .json {
            printLine(answer.text)
            return
        }
        for endpoint in answer["endpoints"]?.arrayValue ?? [] {
            func window(_ name: String) -> String {
                let window = endpoint[name]
                let rate = window?["successRate"]?.doubleValue.map { String(format: "%.1f%%", $0 * 100) } ?? "-"
                let p50 = window?["p50Ms"]?.int64Value.map { "\($0)ms" } ?? "-"
                let p99 = window?["p99Ms"]?.int64Value.map { "\($0)ms" } ?? "-"
                return "\(rate) of \(window?["attempts"]?.int64Value ?? 0) p50=\(p50) p99=\(p99)"
            }
            var line = "\(endpoint["id"]?.stringValue ?? "-")  app=\(endpoint["app"]?.stringValue ?? "-")  host=\(endpoint["host"]?.stringValue ?? "-")"
            line += "  1h: \(window("lastHour"))  24h: \(window("lastDay"))"
            line += "  circuit=\(endpoint["circuit"]?.stringValue ?? "-")"
            if endpoint["disabled"]?.boolValue == true { line += "  DISABLED (410)" }
            if let paused = endpoint["pausedUntil"]?.int64Value { line += "  paused-until=\(Timestamp.rfc3339(milliseconds: paused))" }
            let backlog = endpoint["backlog"]
            line += "  retrying=\(backlog?["retrying"]?.int64Value ?? 0) dead=\(backlog?["dead"]?.int64Value ?? 0)"
            if let failure = endpoint["lastFailure"], failure != .null {
                let at = failure["finishedAt"]?.int64Value.map { Timestamp.rfc3339(milliseconds: $0) } ?? "-"
                line += "  last-failure=\(at) \(failure["error"]?.stringValue ?? failure["outcome"]?.stringValue ?? "-")"
            }
            printLine(line)
        }
    }
}

struct EndpointsEnable: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enable",
        abstract: "Enable an endpoint a 410 Gone disabled, in every deliverer.",
        discussion: """
            Calls POST /subscriptions-api/internal/v1/endpoints/{id}/enable with backend.apiKey (the secret key). The \
            deliverers enable it as they read the request from the deliveries topic. What was dead-lettered while it \
            was disabled is not sent by this: use `endpoints recover` for that.
            """)

    @OptionGroup var backend: BackendOptions

    @Argument(help: "The endpoint's id (endpoints[].id).")
    var endpoint: String

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let path = "/subscriptions-api/internal/v1/endpoints/\(PercentEncoding.pathSegment(endpoint))/enable"
        let answer = try await reading(reader) { (client) async throws(BackendError) in try await client.act(path) }
        printLine(answer.text)
    }
}

struct EndpointsRecover: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recover",
        abstract: "Re-send, once, each event whose attempt to this endpoint failed or died in a time range and has not succeeded since.",
        discussion: """
            Calls POST /subscriptions-api/internal/v1/endpoints/{id}/recover with backend.apiKey (the secret key), as many \
            times as it takes (5,000 a call). Running it again re-sends nothing already re-sent, unless it failed \
            again since. Prints each call's answer.
            """)

    @OptionGroup var backend: BackendOptions

    @Argument(help: "The endpoint's id (endpoints[].id).")
    var endpoint: String

    @Option(help: "Failures finished at or after this time: a date, an RFC 3339 time or Unix milliseconds.")
    var since: String

    @Option(help: "Failures finished before this time (default: now).")
    var until: String?

    func validate() throws {
        _ = try time(since, option: "since")
        _ = try time(until, option: "until")
    }

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let path = "/subscriptions-api/internal/v1/endpoints/\(PercentEncoding.pathSegment(endpoint))/recover"
        // The range is fixed once, so the calls after the first cover the same range.
        let until = until ?? String(Int64(Date().timeIntervalSince1970 * 1000))
        let query = [("since", since), ("until", until)]
        var more = true
        while more {
            let answer = try await reading(reader) { (client) async throws(BackendError) in try await client.act(path, query: query) }
            printLine(answer.text)
            more = answer["more"]?.boolValue == true
        }
    }
}
