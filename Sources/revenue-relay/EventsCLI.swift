import ArgumentParser
import Foundation
import RelayApp
import RelayBackend
import RelayHistory
import Logging
import Metrics
import RelayConfig
import RelayCore
import RelayHTTPClient

/// The filters `events` and `revenue` share: the query parameters of the events route.
struct EventFilterOptions: ParsableArguments {
    @Option(help: "Only this app key.")
    var app: String?

    @Option(name: [.customLong("app-user-id"), .customLong("user")], help: "Only this app user id (the route's appUserId).")
    var appUserId: String?

    @Option(name: .customLong("original-transaction-id"), help: "Only this subscription (its originalTransactionId).")
    var originalTransactionId: String?

    @Option(help: "Only these event types, comma-separated (renewal,initial_purchase,...).")
    var type: String?

    @Option(help: "Only this store: apple, google, stripe or paddle.")
    var store: String?

    @Option(help: "PRODUCTION, SANDBOX or ALL.")
    var environment: String?

    @Option(help: "Events at or after this store time: a date (2026-11-01), an RFC 3339 time or Unix milliseconds.")
    var since: String?

    @Option(help: "Events before this store time.")
    var until: String?

    @Option(name: .customLong("notification-id"), help: "Only the events of this store notification (its id in data.source.notificationId).")
    var notificationId: String?

    @Option(help: "true: only events imported from a store's history; false: only live ones.")
    var historical: Bool?

    var query: [(String, String)] {
        [
            ("app", app), ("appUserId", appUserId), ("originalTransactionId", originalTransactionId), ("type", type), ("store", store),
            ("environment", environment), ("since", since), ("until", until), ("notificationId", notificationId),
            ("historical", historical.map(String.init)),
        ].compactMap { name, value in value.map { (name, $0) } }
    }
}

/// Where the backend is: `--backend-url`, else the configuration's `backend.url`, with its `backend.apiKey`.
struct BackendOptions: ParsableArguments {
    @Option(help: "The configuration file (backend.url and backend.apiKey).")
    var config: String

    @Option(name: .customLong("backend-url"), help: "The backend's URL instead of backend.url (dev: its backend.listen address).")
    var backendURL: String?

    /// The backend's client, or exit 78 when the configuration has no `backend.apiKey`.
    func reader() throws -> BackendReading {
        let configuration = try loadConfiguration(config)
        guard let apiKey = configuration.backend.clientKey, !apiKey.isEmpty else {
            FileHandle.standardError.write(Data("revenue-relay: backend.apiKey is not set in \(config)\n".utf8))
            throw Exit.badConfiguration
        }
        var url = backendURL ?? configuration.backend.url
        while url.hasSuffix("/") { url.removeLast() }
        var logger = Logger(label: "revenue-relay")
        logger.logLevel = .warning
        return BackendReading(
            client: BackendClient(
                configuration: configuration.backend, address: BackendAddress(url), http: HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(60)),
                logger: logger, metrics: NOOPMetricsHandler.instance),
            url: url)
    }
}

/// The backend client of a reading command and the URL its messages name.
struct BackendReading {
    var client: BackendClient
    var url: String
}

/// Runs a backend read, turning its failure into the message on standard error and the exit code.
func reading<Result>(_ backend: BackendReading, _ body: (BackendClient) async throws(BackendError) -> Result) async throws -> Result {
    do {
        return try await body(backend.client)
    } catch {
        let failure = CommandFailure(error, backendURL: backend.url)
        FileHandle.standardError.write(Data("revenue-relay: \(failure)\n".utf8))
        throw ExitCode(failure.exitCode)
    }
}

/// `revenue-relay events`: every recorded event that matches, as JSON lines or CSV, paged from the
/// backend's events route (a page of 1,000 at a time, so any number of events streams through).
struct Events: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Export the recorded standardized events from the backend, as JSON lines or CSV.")

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case jsonl
        case csv
    }

    @OptionGroup var backend: BackendOptions
    @OptionGroup var filter: EventFilterOptions

    @Option(help: "jsonl (one event payload per line) or csv (one row per event).")
    var format: Format = .jsonl

    @Option(help: "Write to this file instead of standard output.")
    var output: String?

    /// The CSV columns, from each event's payload.
    static let columns = [
        "id", "type", "projectId", "applicationId", "store", "environment", "ts", "originalTransactionId", "appUserId", "productId",
        "transactionId", "price", "proceeds", "currencyCode", "priceInPurchasedCurrency", "cancelReason", "expirationReason",
    ]

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        let sink: FileHandle
        if let output {
            guard FileManager.default.createFile(atPath: output, contents: nil) , let handle = FileHandle(forWritingAtPath: output) else {
                FileHandle.standardError.write(Data("revenue-relay: cannot write \(output)\n".utf8))
                throw Exit.badArguments
            }
            sink = handle
        } else {
            sink = FileHandle.standardOutput
        }
        if format == .csv { sink.write(Data((Self.columns.joined(separator: ",") + "\n").utf8)) }
        var count = 0
        let format = format
        try await reading(reader) { (client) async throws(BackendError) in
            try await client.events(filter.query) { page in
                var text = ""
                for event in page {
                    text += format == .csv ? Self.csvRow(event) : event.text
                    text += "\n"
                }
                count += page.count
                sink.write(Data(text.utf8))
            }
        }
        if output != nil {
            try sink.close()
            FileHandle.standardError.write(Data("revenue-relay: \(count) events written to \(output!)\n".utf8))
        }
    }

    static func csvRow(_ event: JSON) -> String {
        let data = event["data"] ?? .null
        return columns.map { column -> String in
            let value: JSON? = switch column {
            case "type", "projectId", "applicationId": event[column]
            case "store": data["source"]?["store"]
            case "ts": data["ts"]?.int64Value.map { .string(Timestamp.rfc3339(milliseconds: $0)) }
            case "appUserId": data["appUserId"] ?? data["originalAppUserId"]
            default: data[column]
            }
            return csvField(value)
        }.joined(separator: ",")
    }

    /// RFC 4180: quoted when it holds a comma, a quote or a line break; quotes doubled.
    static func csvField(_ value: JSON?) -> String {
        let text: String = switch value {
        case nil, .null?: ""
        case .string(let string)?: string
        case let other?: other.text
        }
        guard text.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" }) else { return text }
        return "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}

/// `revenue-relay revenue`: gross, refunds, net and proceeds in USD from the recorded events, grouped.
struct Revenue: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Revenue in USD from the recorded events: gross, refunds, net and proceeds, grouped by day, month, product, store, currency or app.")

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case table
        case csv
        case json
    }

    @OptionGroup var backend: BackendOptions
    @OptionGroup var filter: EventFilterOptions

    @Option(name: .customLong("group-by"), help: "Comma-separated: day, month, product, store, currency, app.")
    var groupBy: String?

    @Option(help: "table, csv or json.")
    var format: Format = .table

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        var query = filter.query
        if let groupBy { query.append(("groupBy", groupBy)) }
        let report = try await reading(reader) { (client) async throws(BackendError) in
            try await client.read("/subscriptions-api/internal/v1/revenue", query)
        }
        if format == .json {
            printLine(report.text)
            return
        }
        let groups = report["groupBy"]?.arrayValue?.compactMap(\.stringValue) ?? []
        let header = groups + ["gross", "refunds", "net", "proceeds", "purchases", "refundCount"]
        func cells(_ object: JSON?, label: String?) -> [String] {
            let keys = groups.map { key in label ?? (object?[key]?.stringValue ?? "-") }
            let sums = ["gross", "refunds", "net", "proceeds"].map { key in String(format: "%.2f", object?[key]?.doubleValue ?? 0) }
            let counts = ["purchases", "refundCount"].map { key in String(object?[key]?.int64Value ?? 0) }
            return keys + sums + counts
        }
        var rows = (report["rows"]?.arrayValue ?? []).map { cells($0, label: nil) }
        if format == .csv {
            printLine(header.joined(separator: ","))
            for row in rows { printLine(row.map { Events.csvField(.string($0)) }.joined(separator: ",")) }
            return
        }
        // Without groups the one row is the total: printed once.
        if groups.isEmpty { rows = [] }
        rows.append(cells(report["total"], label: "total"))
        let widths = header.indices.map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        func line(_ row: [String]) -> String {
            row.enumerated().map { column, text in
                column < groups.count ? text.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[column] - text.count) + text
            }.joined(separator: "  ")
        }
        printLine(line(header))
        for row in rows { printLine(line(row)) }
        printLine("USD; \(report["eventsWithoutRate"]?.int64Value ?? 0) events without an exchange rate are not included")
    }
}
