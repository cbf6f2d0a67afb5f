import ArgumentParser
import Foundation
import RelayApp
import RelayCore
import RelayConfig
import RelayHistory
import Logging

/// A store history command's run: opens the log and the commands `make` builds (exit with the problem
/// otherwise), runs `body` with a progress line on a terminal, closes the log, and ends the progress line.
func runHistory<Commands, Summary>(
    _ options: AppleCommandOptions, clientID: String, _ make: (RelayConfiguration, any RecordProducer, Logger) throws(CommandFailure) -> Commands,
    _ body: (Commands, @escaping @Sendable (String) -> Void) async throws(CommandFailure) -> Summary
) async throws -> Summary {
    let (log, commands) = try await options.open(clientID: clientID, make)
    let progress = progressLine()
    let summary = try await running(log) { () async throws(CommandFailure) in try await body(commands, progress) }
    if isatty(2) != 0 { stderrLine("") }
    return summary
}

/// The summary of a `reconcile` command on stdout (each corrected subscription had its line already).
func printReconcile(_ summary: ReconcileSummary) {
    printLine("checked: \(summary.checked)")
    printLine("in sync: \(summary.inSync)")
    printLine("corrected: \(summary.corrections.count)")
    if summary.otherEnvironment > 0 { printLine("not checked (other environment than serverApi's): \(summary.otherEnvironment)") }
    printLine("failures: \(summary.failures.count)")
    for failure in summary.failures { printLine("  \(failure)") }
}

/// The summary of `import stripe` or `import paddle` on stdout.
func printImport(_ summary: SubscriptionImportSummary) {
    printLine("subscriptions: \(summary.subscriptions)")
    printLine("imported: \(summary.imported) (\(summary.renewals) renewals, \(summary.refunds) refunds)")
    printLine("already known: \(summary.alreadyKnown)")
    printLine("other apps' prices: \(summary.otherApps)")
}

struct RecoverStripe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stripe",
        abstract: "Re-ingest Stripe events the relay missed (GET /v1/events).",
        discussion: """
            Lists the Stripe events created from --since to --until (default: now) of the types the relay maps, \
            with apps[].stripe.api, and appends each one the relay never processed (no events recorded for its id, \
            and its subscription's state does not remember it) to the notifications topic, oldest first, as a \
            relay-source: stripe-api record. The worker reads each event from Stripe's API and applies it as the \
            webhook it stands for: the same event ids, delivered to the endpoints as missed events. Stripe keeps 30 \
            days of events: an older --since is refused. Running it again appends nothing the worker has processed. \
            A progress line on a terminal; the summary on stdout. Times: a date (2026-11-01), an RFC 3339 time or \
            Unix milliseconds. Exit 0: done; 64: bad arguments; 69: the log, the backend or Stripe unreachable; \
            78: bad configuration (no stripe.api) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Events Stripe created at or after this time (within the last 30 days).")
    var since: String

    @Option(help: "Events created before this time (default: now).")
    var until: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since") ?? 0
        let until = try time(until, option: "until")
        let summary = try await runHistory(options, clientID: "revenue-relay-recover", options.stripe) { commands, progress throws(CommandFailure) in
            try await commands.recover(since: since, until: until, progress: progress)
        }
        printLine("found: \(summary.found)")
        printLine("already processed: \(summary.alreadyProcessed)")
        printLine("re-ingested: \(summary.reingested)")
    }
}

struct RecoverGoogle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "google",
        abstract: "Re-ingest Google Play refunds, chargebacks and revocations the relay missed (the Voided Purchases API).",
        discussion: """
            Lists the purchases Google voided from --since to --until (default: now) with apps[].google.playApi, \
            and appends each one the relay never recorded (no refund of its order among its purchase token's events) \
            to the notifications topic, oldest first, as the voided-purchase notification Play would have pushed \
            (relay-source: play-api, id voided:<orderId>). The worker finds each again in the Voided Purchases API \
            before it applies it: the refund takes the money back and, when Google revoked the purchase, the \
            access. Google lists 30 days: an older --since is refused. Running it again appends nothing the worker \
            has processed. The service account needs "View financial data" in Play Console. Times: a date, an \
            RFC 3339 time or Unix milliseconds. Exit 0: done; 64: bad arguments; 69: the log, the backend or the \
            Play Developer API unreachable; 78: bad configuration (no playApi) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Purchases voided at or after this time (within the last 30 days).")
    var since: String

    @Option(help: "Purchases voided before this time (default: now).")
    var until: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since") ?? 0
        let until = try time(until, option: "until")
        let summary = try await runHistory(options, clientID: "revenue-relay-recover", options.google) { commands, progress throws(CommandFailure) in
            try await commands.recover(since: since, until: until, progress: progress)
        }
        printLine("found: \(summary.found)")
        printLine("already recorded: \(summary.alreadyProcessed)")
        printLine("re-ingested: \(summary.reingested)")
    }
}

struct RecoverPaddle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "paddle",
        abstract: "Have Paddle send again the notifications whose events the relay missed (notification replay).",
        discussion: """
            Lists the notifications Paddle sent from --since to --until (default: now) with apps[].paddle.api and, \
            for each event of a type the relay maps that it never processed (no events recorded for its event_id, \
            and its subscription's state does not remember it), asks Paddle to replay the event's first \
            notification (POST /notifications/{id}/replay). Paddle signs and sends it to the notification \
            destination, the relay's ingest, where it goes through the unchanged path. Replays arrive \
            asynchronously. Times: a date, an RFC 3339 time or Unix milliseconds. Exit 0: done; 64: bad \
            arguments; 69: the backend or Paddle unreachable; 78: bad configuration (no paddle.api) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Notifications Paddle sent at or after this time.")
    var since: String

    @Option(help: "Notifications sent before this time (default: now).")
    var until: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since") ?? 0
        let until = try time(until, option: "until")
        // Nothing is appended to the log: Paddle sends the replays to the ingest. The log is opened (and
        // closed at once) only so the options mean what they mean for the other stores.
        let summary = try await runHistory(options, clientID: "revenue-relay-recover", options.paddle) { commands, progress throws(CommandFailure) in
            try await commands.recover(since: since, until: until, progress: progress)
        }
        printLine("found: \(summary.found)")
        printLine("already processed: \(summary.alreadyProcessed)")
        printLine("replayed: \(summary.replayed)")
        if summary.refused > 0 { printLine("refused by Paddle: \(summary.refused)") }
    }
}

struct ImportGoogle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "google",
        abstract: "Import Google Play purchases named in a file (purchase token, product id, app user id) as historical events.",
        discussion: """
            Google Play lists no app's purchases, so the file names them: one a line, purchaseToken,productId[,appUserId], \
            or CSV with a header naming purchase_token, product_id and app_user_id (as RevenueCat's Google import \
            takes them). Each is read from the Play Developer API with apps[].google.playApi (a subscription, else a \
            one-time product) and appended as a relay-source: play-api record; the worker reads it again and applies \
            it as Play's purchase notification: the state as Play knows it now and the purchase's event, recorded \
            as historical and, unless --deliver, not sent to endpoints; bound to the app user when the line names \
            one. Play's API lists no past renewals. Purchases the relay already holds are skipped, so running it \
            again (or after an interruption) imports only the rest. Exit 0: done; 64: bad arguments or an \
            unreadable file; 69: the log, the backend or the Play API unreachable; 78: bad configuration (no playApi).
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "The file of purchases: purchaseToken,productId[,appUserId] a line, or CSV with a header.")
    var file: String

    @Flag(help: "Send the imported events to the endpoints too (default: recorded only).")
    var deliver = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        guard let data = FileManager.default.contents(atPath: file) else { throw ValidationError("cannot read --file \(file)") }
        let purchases: [GoogleHistoryCommands.ImportLine]
        do {
            purchases = try GoogleHistoryCommands.parseImportFile(String(decoding: data, as: UTF8.self))
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw ExitCode(error.exitCode)
        }
        let deliver = deliver
        let summary = try await runHistory(options, clientID: "revenue-relay-import", options.google) { commands, progress throws(CommandFailure) in
            try await commands.importPurchases(purchases, deliver: deliver, progress: progress)
        }
        printLine("purchases: \(summary.purchases)")
        printLine("imported: \(summary.imported)")
        printLine("already known: \(summary.alreadyKnown)")
        printLine("unknown to Google Play: \(summary.unknown)")
    }
}

struct ReconcileGoogle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "google",
        abstract: "Correct stored Google Play subscription states that differ from Play's (subscriptionsv2.get).",
        discussion: """
            Lists the app's Google Play subscriptions the backend holds as active (or written since --since), reads \
            each from the Play Developer API with apps[].google.playApi, and where Play's subscriptionState, expiry \
            or auto-renewal differs from the stored state, appends the Real-time Developer Notification Play would \
            have pushed for the change (SUBSCRIPTION_RENEWED, _RECOVERED, _CANCELED, _RESTARTED, _IN_GRACE_PERIOD, \
            _ON_HOLD, _PAUSED or _EXPIRED) as a relay-source: play-api record. The worker reads the subscription \
            from Play again and applies it: these are missed events, delivered to the endpoints. The id is \
            reconcile:<token>:<type>:<Play's expiry>, the same on every run until Play's answer changes. One line \
            per corrected subscription (stored → Google: action), then a summary. Exit 0: done; 64: bad arguments; \
            69: the log, the backend or the Play Developer API unreachable; 78: bad configuration (no playApi) or \
            the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Also check subscriptions written at or after this time that are no longer active.")
    var since: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since")
        let summary = try await runHistory(options, clientID: "revenue-relay-reconcile", options.google) { commands, progress throws(CommandFailure) in
            try await commands.reconcile(since: since, progress: progress, corrected: { printLine($0.line) })
        }
        printReconcile(summary)
    }
}

struct ReconcileStripe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stripe",
        abstract: "Correct stored Stripe subscription states that differ from Stripe's (GET /v1/subscriptions/{id}).",
        discussion: """
            Lists the app's Stripe subscriptions the backend holds as active (or written since --since), reads each \
            from Stripe with apps[].stripe.api, and where Stripe's status, period end, auto-renewal (cancel_at_period_end, \
            cancel_at) or price differs from the stored state, appends relay-source: stripe-api records: the latest \
            paid invoice when the period moved on without it (a missed renewal, with its money), then the \
            subscription. The worker reads each from Stripe again and applies it as the event Stripe would have sent \
            (invoice.paid, customer.subscription.updated with what changed, or customer.subscription.deleted): these \
            are missed events, delivered to the endpoints. Ids are reconcile:<id>:<what Stripe answered>, the same on \
            every run until Stripe's answer changes. One line per corrected subscription, then a summary. Exit 0: \
            done; 64: bad arguments; 69: the log, the backend or Stripe unreachable; 78: bad configuration (no \
            stripe.api) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Also check subscriptions written at or after this time that are no longer active.")
    var since: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since")
        let summary = try await runHistory(options, clientID: "revenue-relay-reconcile", options.stripe) { commands, progress throws(CommandFailure) in
            try await commands.reconcile(since: since, progress: progress, corrected: { printLine($0.line) })
        }
        printReconcile(summary)
    }
}

struct ReconcilePaddle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "paddle",
        abstract: "Correct stored Paddle subscription states that differ from Paddle's (GET /subscriptions/{id}).",
        discussion: """
            Lists the app's Paddle subscriptions the backend holds as active (or written since --since), reads each \
            from Paddle with apps[].paddle.api, and where Paddle's status, billing period end, scheduled cancellation \
            or price differs from the stored state, appends relay-source: paddle-api records: the latest completed \
            transaction when the period moved on without it (a missed renewal, with its money), then the \
            subscription. The worker reads each from Paddle again and applies it as the event Paddle would have \
            sent (transaction.completed, subscription.updated compared with the stored state, or \
            subscription.canceled): these are missed events, delivered to the endpoints. Ids are \
            reconcile:<id>:<what Paddle answered>, the same on every run until Paddle's answer changes. One line per \
            corrected subscription, then a summary. Exit 0: done; 64: bad arguments; 69: the log, the backend or \
            Paddle unreachable; 78: bad configuration (no paddle.api) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Also check subscriptions written at or after this time that are no longer active.")
    var since: String?

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since")
        let summary = try await runHistory(options, clientID: "revenue-relay-reconcile", options.paddle) { commands, progress throws(CommandFailure) in
            try await commands.reconcile(since: since, progress: progress, corrected: { printLine($0.line) })
        }
        printReconcile(summary)
    }
}

struct ImportStripe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stripe",
        abstract: "Import the account's Stripe subscriptions with their renewals and refunds as historical events.",
        discussion: """
            Lists the account's subscriptions (GET /v1/subscriptions?status=all, created at or after --since) with \
            apps[].stripe.api; those whose price is one of the app's STRIPE products (all, when it lists none) and \
            that the relay does not hold are imported: the purchase at its start, each paid renewal invoice with its \
            money, each refund of those invoices' charges, then the subscription as it is now (its cancellation or \
            end). Each is a relay-source: stripe-api record the worker reads again from Stripe and applies as the \
            event Stripe would have sent, recorded as historical and, unless --deliver, not sent to endpoints. \
            Subscriptions the relay holds are skipped, so running it again (or after an interruption) imports only \
            the rest. Exit 0: done; 64: bad arguments; 69: the log, the backend or Stripe unreachable; 78: bad \
            configuration (no stripe.api) or the key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "Only subscriptions created at or after this time (default: all).")
    var since: String?

    @Flag(help: "Send the imported events to the endpoints too (default: recorded only).")
    var deliver = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let since = try time(since, option: "since")
        let deliver = deliver
        let summary = try await runHistory(options, clientID: "revenue-relay-import", options.stripe) { commands, progress throws(CommandFailure) in
            try await commands.importSubscriptions(since: since, deliver: deliver, progress: progress)
        }
        printImport(summary)
    }
}

struct ImportPaddle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "paddle",
        abstract: "Import the account's Paddle subscriptions with their renewals and refunds as historical events.",
        discussion: """
            Lists the account's subscriptions (GET /subscriptions) with apps[].paddle.api; those whose price is one \
            of the app's PADDLE products (all, when it lists none) and that the relay does not hold are imported: \
            the purchase at its start, each completed renewal transaction with its money, each approved refund or \
            chargeback, then the subscription as it is now (its cancellation or end). Each is a relay-source: \
            paddle-api record the worker reads again from Paddle and applies as the event Paddle would have sent, \
            recorded as historical and, unless --deliver, not sent to endpoints. Subscriptions the relay holds are \
            skipped, so running it again (or after an interruption) imports only the rest. Exit 0: done; 64: bad \
            arguments; 69: the log, the backend or Paddle unreachable; 78: bad configuration (no paddle.api) or the \
            key refused.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Flag(help: "Send the imported events to the endpoints too (default: recorded only).")
    var deliver = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let deliver = deliver
        let summary = try await runHistory(options, clientID: "revenue-relay-import", options.paddle) { commands, progress throws(CommandFailure) in
            try await commands.importSubscriptions(deliver: deliver, progress: progress)
        }
        printImport(summary)
    }
}

struct ImportRevenueCat: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revenuecat",
        abstract: "Import RevenueCat's Scheduled Data Export (the Transactions feed, CSV) as states and historical events.",
        discussion: """
            Reads RevenueCat's Transactions export (CSV with its header row; export versions 3 to 7; gunzip the \
            .csv.gz files first, or pass - to read standard input). Give several --file in delivery order: a \
            transaction sent again keeps its newest version (updated_at). Each transaction of the App Store, the \
            Play Store or Stripe becomes records of its store (relay-source: revenuecat) for its payment, billing \
            issue, cancellation of renewal, refund and, for a subscription that ended, its expiration; a \
            promotional one becomes a promotional grant. The worker applies them: states and historical events, \
            not sent to endpoints unless --deliver. The purchase belongs to rc_last_seen_app_user_id_alias, and \
            rc_original_app_user_id is linked to it as an alias. What the relay recorded already (from the \
            stores, or a previous run) is skipped, so a rerun appends only the rest. Other stores are counted and \
            left out. Exit 0: done; 64: bad arguments or a file that is not the export; 69: the log or the \
            backend unreachable; 78: bad configuration.
            """)

    @OptionGroup var options: AppleCommandOptions

    @Option(help: "A Transactions export file (CSV), or - for standard input; repeat for several deliveries, oldest first.")
    var file: [String]

    @Flag(help: "Send the imported events to the endpoints too (default: recorded only).")
    var deliver = false

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        guard !file.isEmpty else { throw ValidationError("--file is required") }
        var texts: [String] = []
        for path in file {
            let data = path == "-" ? FileHandle.standardInput.readDataToEndOfFile() : FileManager.default.contents(atPath: path)
            guard let data else { throw ValidationError("cannot read --file \(path)") }
            guard data.prefix(2) != Data([0x1F, 0x8B]) else { throw ValidationError("--file \(path) is gzip-compressed: gunzip it first (or gunzip -c \(path) | … --file -)") }
            texts.append(String(decoding: data, as: UTF8.self))
        }
        let transactions: [RevenueCatHistoryCommands.Transaction]
        do {
            transactions = try RevenueCatHistoryCommands.parseExport(texts)
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw ExitCode(error.exitCode)
        }
        let deliver = deliver
        let summary = try await runHistory(options, clientID: "revenue-relay-import", options.revenueCat) { commands, progress throws(CommandFailure) in
            try await commands.importTransactions(transactions, deliver: deliver, progress: progress)
        }
        printLine("transactions: \(summary.transactions)")
        printLine("subscriptions: \(summary.subscriptions)")
        printLine("records appended: \(summary.appended)")
        printLine("already recorded: \(summary.alreadyRecorded)")
        var notLinked: [String] = []
        if summary.aliasConflicts > 0 { notLinked.append("\(summary.aliasConflicts) already another user's") }
        if summary.aliasesNotLinked > 0 { notLinked.append("\(summary.aliasesNotLinked) with an id the backend refuses, not linked") }
        printLine("aliases linked: \(summary.aliasesLinked)\(notLinked.isEmpty ? "" : " (\(notLinked.joined(separator: "; ")))")")
        let leftOut = summary.leftOut.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        printLine("left out: \(leftOut.isEmpty ? "none" : leftOut)")
    }
}
