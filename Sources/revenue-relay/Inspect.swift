import ArgumentParser
import Foundation
import Logging
import Metrics
import RelayApp
import RelayConfig
import RelayCore
import RelayNormalization
import RelayVerification
import RelayWorker

/// `revenue-relay inspect` (docs/contracts.md, Command line): verifies and normalizes one saved request body without
/// Kafka or the backend (no prior state; products from the config; Google calls the configured Play
/// Developer API) and prints the verdict and the standardized events as one JSON object.
struct Inspect: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Verify and normalize one saved store request; print the verdict and the events as JSON.",
        discussion: """
            FILE is the request body exactly as the store POSTed it ('-' reads stdin); for Apple, the \
            {"signedPayload": ...} object. Pass the signature headers the store sent with --header. \
            Exit 0: accepted; 65: rejected (the reason and detail are printed); 64: bad arguments; \
            69: Google's keys, the Play Developer API or Stripe's API could not be reached; 78: bad configuration.
            """
    )

    @Option(help: "Configuration file.")
    var config: String

    @Option(help: "apple, google, stripe or paddle.")
    var store: String

    @Option(help: "The app key (as in the ingest URL).")
    var app: String

    @Option(name: .customLong("header"), help: "A request header, 'Name: value' (repeatable).")
    var headers: [String] = []

    @Option(help: "The receive time, Unix seconds (default: now). Timestamp tolerances are checked against it.")
    var now: Int64?

    @Argument(help: "The saved request body, or '-' for stdin.")
    var file: String

    func validate() throws {
        guard let known = Store(rawValue: store), Store.notificationStores.contains(known) else { throw ValidationError("--store must be apple, google, stripe or paddle") }
        if let now, !(0...4_102_444_800).contains(now) {
            throw ValidationError("--now must be Unix seconds between 1970 and 2100")
        }
        for header in headers where Self.parseHeader(header) == nil {
            throw ValidationError("--header must look like 'Name: value' (got '\(header.prefix(40))')")
        }
    }

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let body: [UInt8]
        if file == "-" {
            body = Array(FileHandle.standardInput.readDataToEndOfFile())
        } else {
            guard let data = FileManager.default.contents(atPath: file) else {
                throw ValidationError("cannot read \(file)")
            }
            body = Array(data)
        }
        let configuration = try loadConfiguration(config)
        let logger = Logger(label: "revenue-relay")
        let verifier: NotificationVerifier
        let normalizer: SubscriptionUpdater
        do {
            verifier = try NotificationVerifier(configuration: configuration, logger: logger)
            normalizer = try SubscriptionUpdater(
                configuration: configuration, stateStore: StatelessStateStore(configuration: configuration),
                storeAPIs: try StoreAPIs.configured(configuration, logger: logger), logger: logger, metrics: NOOPMetricsHandler.instance)
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
            throw Exit.badConfiguration
        }
        var requestHeaders: [String: String] = [:]
        for header in headers {
            if let (name, value) = Self.parseHeader(header) { requestHeaders[name] = value }
        }
        let receivedAt = now ?? Int64(Date().timeIntervalSince1970)
        let notification = RawNotification(
            store: Store(rawValue: store)!, app: app, receivedAtMilliseconds: receivedAt * 1000, body: body, requestHeaders: requestHeaders)
        // The worker's own processing: what this prints is what the worker would do (without prior state).
        let outcome: NotificationEvaluator.Outcome
        do {
            outcome = try await NotificationEvaluator(verifier: verifier, normalizer: normalizer).evaluate(notification)
        } catch {
            FileHandle.standardError.write(Data("revenue-relay: \(error.message)\n".utf8))
            throw Exit.unavailable
        }
        switch outcome {
        case .accepted(let verified, let events):
            let output: JSON = [
                "accepted": true, "store": .string(verified.store.rawValue), "notification": verified.payload,
                "events": .array(events.map(\.payload.json)),
            ]
            printLine(output.text)
        case .rejected(let rejection, _):
            let output: JSON = ["accepted": false, "reason": .string(rejection.reason.rawValue), "detail": .string(rejection.detail)]
            printLine(output.text)
            throw Exit.rejected
        }
    }

    /// `Name: value` → (lower-case name, trimmed value).
    static func parseHeader(_ text: String) -> (String, String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = text[..<colon].trimmingCharacters(in: .whitespaces).lowercased()
        guard !name.isEmpty, !name.contains(" ") else { return nil }
        return (name, text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces))
    }
}
