import Foundation
public import Logging
public import RelayAppStoreAPI
import RelayBackend
public import RelayConfig
public import RelayCore
public import RelayHTTPClient
import RelayVerification

/// `revenue-relay import apple`, `recover apple` and `reconcile apple`: what the App Store Server API
/// knows, brought through the normal pipeline. Nothing here writes state or events itself: each command
/// appends raw notification records to `relay.notifications`, and the worker verifies and normalizes them
/// like any notification (so a repeat is absorbed where every repeat is: the normalizer's recent
/// notification ids and the events store's event ids).
///
/// - `import` appends `relay-source: apple-api` records (a signed transaction from Get Transaction History
///   with a notification type) marked `relay-historical: true`, and `relay-deliver: false` unless asked.
/// - `recover` appends the `signedPayload`s of Get Notification History whose notificationUUID has no
///   events in the events store, exactly as the ingest would have.
/// - `reconcile` compares the backend's active (or recently changed) subscriptions with Get All
///   Subscription Statuses and appends, for each drift, the apple-api record that brings the state to Apple's.
///
/// Secrets stay out of every message: the key is named by its ids, bearer tokens never appear.
public struct AppleHistoryCommands: Sendable {
    /// Why a command could not run or finish (`CommandFailure`).
    public typealias Failure = CommandFailure

    /// The days of notification history Apple keeps: 180 in production, 30 in the sandbox (Get
    /// Notification History).
    public static func notificationHistoryDays(_ environment: AppStoreServerEnvironment) -> Int64 {
        environment == .production ? 180 : 30
    }

    public let app: RelayConfiguration.App
    let apple: RelayConfiguration.Apple
    let client: AppStoreServerClient
    let verifier: AppleVerifier
    let producer: any RecordProducer
    let topic: String
    let backend: HistoryBackend
    let now: @Sendable () -> Int64
    let logger: Logger
    /// How the commands wait out Apple's rate limits and outages.
    public var pacing = HistoryLoop.Pacing.standard

    /// - Parameters:
    ///   - appKey: the `apps[].key` whose `apple.serverApi` is used.
    ///   - producer: appends to the configured log (`ToolLog`, or a running relay's).
    ///   - backendURL: the backend instead of `backend.url` (dev's `backend.listen` address).
    ///   - retry: the App Store Server API client's retries (`Retry-After` is honoured up to its maximum).
    ///   - now: Unix milliseconds.
    public init(
        configuration: RelayConfiguration, appKey: String, producer: any RecordProducer, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8),
        retry: AppStoreServerClient.RetryPolicy = .standard, logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        let (app, index) = try HistoryRun.app(configuration, key: appKey)
        guard let apple = app.apple else {
            throw Failure(.configuration, "app \(appKey) has no apple section (apps[\(index)].apple); the App Store commands need one")
        }
        guard let serverApi = apple.serverApi else {
            throw Failure(
                .configuration,
                "app \(appKey) has no App Store Server API key: set apps[\(index)].apple.serverApi {keyId, issuerId, privateKey, environment}"
                    + " to an In-App Purchase key from App Store Connect → Users and Access → Integrations")
        }
        guard let environment = AppStoreServerEnvironment(rawValue: serverApi.environment) else {
            throw Failure(.configuration, "apps[\(index)].apple.serverApi.environment must be Production or Sandbox")
        }
        do {
            let key = try AppStoreConnectKey.load(path: serverApi.privateKey, keyId: serverApi.keyId, issuerId: serverApi.issuerId, bundleId: apple.bundleId)
            client = try AppStoreServerClient(key: key, environment: environment, baseURL: serverApi.baseUrl, http: http, retry: retry, logger: logger)
            // The same rules as the worker's, so a transaction that would be rejected is reported here.
            verifier = try AppleVerifier(app: app.key, configuration: apple, configurationKey: "apps[\(index)].apple", chainCacheCapacity: 64)
        } catch let error as AppStoreAPIError {
            throw Failure(.configuration, "apps[\(index)].apple.serverApi: \(error.message)")
        } catch {
            throw Failure(.configuration, "\(error)")
        }
        self.backend = try HistoryRun.backend(configuration, url: backendURL, http: http, logger: logger)
        self.app = app
        self.apple = apple
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.now = HistoryRun.clock(now)
        self.logger = logger
    }

    static func describe(status: String, expiresAt: Int64?) -> String {
        status + (expiresAt.map { " (expires \(Timestamp.rfc3339(milliseconds: $0)))" } ?? "")
    }

    static func describe(apple status: Int, expiresAt: Int64?) -> String {
        let name =
            switch SubscriptionStatus(rawValue: status) {
            case .active: "active"
            case .expired: "expired"
            case .billingRetry: "billing retry"
            case .billingGracePeriod: "grace period"
            case .revoked: "revoked"
            case nil: "unknown"
            }
        return "\(status) \(name)" + (expiresAt.map { " (expires \(Timestamp.rfc3339(milliseconds: $0)))" } ?? "")
    }

    static func failure(_ error: AppStoreAPIError, what: String, done: String) -> Failure {
        switch error.kind {
        case .keyRefused, .configuration: Failure(.configuration, error.message)
        case .rejected: Failure(.badArguments, "Apple refused \(what): \(error.message)")
        default: Failure(.unavailable, "\(what) failed (\(error.message)); \(done); run the same command again to continue")
        }
    }
}

