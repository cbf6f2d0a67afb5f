import ArgumentParser
import Foundation
import Logging
import RelayApp
import RelayHistory
import RelayConfig
import RelayCore

/// `revenue-relay import`: a store's history through the pipeline (today: `import apple`).
struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import a store's purchase history through the pipeline as historical events.", subcommands: [ImportApple.self, ImportGoogle.self, ImportPaddle.self, ImportRevenueCat.self, ImportStripe.self])
}

/// `revenue-relay recover`: notifications a store sent and the relay missed (every store).
struct Recover: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Re-ingest store notifications the relay missed, from the store's notification history.", subcommands: [RecoverApple.self, RecoverGoogle.self, RecoverPaddle.self, RecoverStripe.self])
}

/// `revenue-relay reconcile`: stored states against the store's own (every store).
struct Reconcile: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Compare stored subscription states with the store's and correct drift through the pipeline.",
        subcommands: [ReconcileApple.self, ReconcileGoogle.self, ReconcilePaddle.self, ReconcileStripe.self])
}

/// The options every store history command takes: the configuration, the app, the log and the backend.
struct AppleCommandOptions: ParsableArguments {
    @OptionGroup var location: LogLocation

    @Option(help: "The app's key (apps[].key): its store's API key (apple.serverApi, stripe.api) is the one used.")
    var app: String

    @Option(name: .customLong("backend-url"), help: "The backend's URL instead of backend.url (dev: its backend.listen address).")
    var backendURL: String?

    /// The log (closed by the caller) and the App Store commands, or exit with the problem (the log closed).
    func open(clientID: String) async throws -> (any RecordLog, AppleHistoryCommands) {
        try await open(clientID: clientID) { configuration, producer, logger throws(CommandFailure) in
            try AppleHistoryCommands(configuration: configuration, appKey: app, producer: producer, backendURL: backendURL, logger: logger)
        }
    }

    /// Each store's commands for this app and backend (`runHistory`'s `make`).
    func stripe(_ configuration: RelayConfiguration, _ producer: any RecordProducer, _ logger: Logger) throws(CommandFailure) -> StripeHistoryCommands {
        try StripeHistoryCommands(configuration: configuration, appKey: app, producer: producer, backendURL: backendURL, logger: logger)
    }

    func google(_ configuration: RelayConfiguration, _ producer: any RecordProducer, _ logger: Logger) throws(CommandFailure) -> GoogleHistoryCommands {
        try GoogleHistoryCommands(configuration: configuration, appKey: app, producer: producer, backendURL: backendURL, logger: logger)
    }

    func paddle(_ configuration: RelayConfiguration, _ producer: any RecordProducer, _ logger: Logger) throws(CommandFailure) -> PaddleHistoryCommands {
        try PaddleHistoryCommands(configuration: configuration, appKey: app, producer: producer, backendURL: backendURL, logger: logger)
    }

    func revenueCat(_ configuration: RelayConfiguration, _ producer: any RecordProducer, _ logger: Logger) throws(CommandFailure) -> RevenueCatHistoryCommands {
        try RevenueCatHistoryCommands(configuration: configuration, appKey: app, producer: producer, backendURL: backendURL, logger: logger)
    }

    /// The log (closed by the caller) and a store's commands made by `make`, or exit with the problem.
    func open<Commands>(
        clientID: String, _ make: (RelayConfiguration, any RecordProducer, Logger) throws(CommandFailure) -> Commands
    ) async throws -> (any RecordLog, Commands) {
        let configuration = try loadConfiguration(location.config)
        let log = try location.openLog(configuration, clientID: clientID)
        let producer: any RecordProducer
        do {
            producer = try log.producer
        } catch {
            await log.close()
            FileHandle.standardError.write(Data("revenue-relay: cannot append to the log: \(error)\n".utf8))
            throw Exit.unavailable
        }
        var logger = Logger(label: "revenue-relay")
        logger.logLevel = .warning
        do {
            return (log, try make(configuration, producer, logger))
        } catch {
            await log.close()
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw ExitCode(error.exitCode)
        }
    }
}

/// Runs a command body, closing the log, and turns a failure into its message and exit code.
func running<Result>(_ log: any RecordLog, _ body: () async throws(AppleHistoryCommands.Failure) -> Result) async throws -> Result {
    do {
        let result = try await body()
        await log.close()
        return result
    } catch {
        await log.close()
        FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
        throw ExitCode(error.exitCode)
    }
}

func stderrLine(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

/// Progress lines of a long run: on a terminal, each replaces the last (`\r`); elsewhere (a log) none.
func progressLine() -> @Sendable (String) -> Void {
    guard isatty(2) != 0 else { return { _ in } }
    return { line in FileHandle.standardError.write(Data(("\r\u{1B}[K" + line).utf8)) }
}

func time(_ text: String?, option: String) throws -> Int64? {
    guard let text else { return nil }
    guard let milliseconds = Timestamp.milliseconds(dateOrTime: text, unixMilliseconds: true) else {
        throw ValidationError("--\(option) must be an ISO 8601 time such as 2026-11-20T08:00:00Z, a date such as 2026-11-20, or Unix milliseconds")
    }
    return milliseconds
}

struct ImportApple: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple",
        abstract: "Import App Store purchase histories (Get Transaction History) as historical events.",
        discussion: """
            For each original transaction id (any transaction id of the customer works), reads every page of \
            the App Store Server API's Get Transaction History with apps[].apple.serverApi, verifies each signed \
            transaction with the app's Apple roots, and appends it to the notifications topic in purchase order as \
            a relay-source: apple-api record: SUBSCRIBED (INITIAL_BUY) for a subscription's first transaction, \
            DID_RENEW for later ones, ONE_TIME_CHARGE for other products, and REFUND (REVOKE when family shared) \
            for a revoked one. The worker verifies and normalizes them like notifications: the states are written, \
            the events recorded as historical (the events route's historical=true), and, unless --deliver, not sent to endpoints. \
            Progress goes to stderr, the summary to stdout.

            Resumable and idempotent: every record's notificationUUID is import:<transactionId>, so its events \
            have the same ids on every run. A run first asks the backend which of a subscription's import records \
            already have events and appends only the others; a record appended but not yet processed when a run \
            stopped is appended again and absorbed (the normalizer remembers recent notification ids, the events \
            store records an id once). An interrupted import is finished by running the same command again. \
            Exit 0: done (failures are listed); 64: bad arguments; 69: the log, the backend or Apple unreachable; \
            78: bad configuration or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(
        name: .customLong("original-transaction-id"), parsing: .upToNextOption,
        help: "Original transaction ids to import (repeatable, or several after one option).")
    var ids: [String] = []

    @Option(help: "A file of original transaction ids, one per line (blank lines and # comments ignored).")
    var file: String?

    @Flag(help: "Also deliver the imported events to the matching endpoints (default: recorded only).")
    var deliver = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        var ids = self.ids
        if let file {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw ValidationError("cannot read --file \(file)") }
            ids += text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty && !$0.hasPrefix("#") }
        }
        guard !ids.isEmpty else { throw ValidationError("give --original-transaction-id ID ... or --file IDS_FILE") }
        var unique: [String] = []
        for id in ids where !unique.contains(id) { unique.append(id) }
        let (log, commands) = try await options.open(clientID: "revenue-relay-import")
        let deliver = self.deliver
        let summary = try await running(log) { () async throws(AppleHistoryCommands.Failure) in
            try await commands.importHistory(originalTransactionIds: unique, deliver: deliver, progress: stderrLine)
        }
        printLine("subscriptions: \(summary.subscriptions)")
        printLine("transactions: \(summary.transactions)")
        printLine("records appended: \(summary.recordsAppended)\(deliver ? " (delivered)" : " (historical, not delivered)")")
        printLine("already imported: \(summary.alreadyImported) (their events are recorded; not appended again)")
        printLine("already recorded live: \(summary.alreadyRecordedLive) (the live pipeline recorded them; not appended)")
        printLine("failures: \(summary.failures.count)")
        for failure in summary.failures { printLine("  \(failure.id): \(failure.reason)") }
        if !summary.failures.isEmpty { printLine("run the same import again to retry the failures; nothing is doubled") }
    }
}

struct RecoverApple: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple",
        abstract: "Re-ingest App Store notifications the relay missed (Get Notification History).",
        discussion: """
            Reads the App Store Server API's Get Notification History from --since to --until (default: now) \
            and appends each notification whose notificationUUID has no events in the backend's events store to \
            the notifications topic, exactly as the ingest would have ({"signedPayload": ...}). Apple keeps 180 \
            days of history (30 in the sandbox): an older --since is refused. Notifications that yield no events \
            (TEST, CONSUMPTION_REQUEST) are skipped: a re-ingested CONSUMPTION_REQUEST would be answered again. Times: a date (2026-11-01), an \
            RFC 3339 time or Unix milliseconds. Exit 0: done; 64: bad arguments; 69: the log, the backend or Apple \
            unreachable; 78: bad configuration or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Notifications Apple sent at or after this time (within the last 180 days; 30 in the sandbox).")
    var since: String

    @Option(help: "Notifications sent before this time (default: now).")
    var until: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since") ?? 0
        let until = try time(until, option: "until")
        let (log, commands) = try await options.open(clientID: "revenue-relay-recover")
        let summary = try await running(log) { () async throws(AppleHistoryCommands.Failure) in
            try await commands.recover(since: since, until: until, progress: stderrLine)
        }
        printLine("found: \(summary.found)")
        printLine("already processed: \(summary.alreadyProcessed)")
        printLine("re-ingested: \(summary.reingested)")
        printLine("skipped (yield no events: CONSUMPTION_REQUEST, TEST): \(summary.skipped)")
        if summary.unreadable > 0 { printLine("unreadable: \(summary.unreadable) (no notificationUUID; not re-ingested)") }
    }
}

struct ReconcileApple: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple",
        abstract: "Correct stored App Store subscription states that differ from Apple's (Get All Subscription Statuses).",
        discussion: """
            Lists the app's Apple subscriptions the backend holds as active (or written since --since), asks \
            the App Store Server API for each one's status, and where Apple's status (1 active, 2 expired, 3 \
            billing retry, 4 grace period, 5 revoked) or expiry differs from the stored state, appends the \
            notification that brings it there: DID_RENEW (RENEWAL_EXTENDED for a payment already recorded), EXPIRED, \
            DID_FAIL_TO_RENEW (GRACE_PERIOD), REVOKE or REFUND, with Apple's signed transaction, as a relay-source: apple-api record. These are missed \
            events: they are delivered to the endpoints. The notificationUUID is \
            reconcile:<Apple's last transactionId>:<status>, the same on every run. One line per corrected subscription (stored → Apple: \
            action), then a summary. Exit 0: done; 64: bad arguments; 69: the log, the backend or Apple \
            unreachable; 78: bad configuration or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Also check subscriptions written at or after this time that are no longer active.")
    var since: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since")
        let (log, commands) = try await options.open(clientID: "revenue-relay-reconcile")
        let summary = try await running(log) { () async throws(AppleHistoryCommands.Failure) in
            try await commands.reconcile(since: since, progress: stderrLine, corrected: { printLine($0.line) })
        }
        printReconcile(summary)
    }
}
