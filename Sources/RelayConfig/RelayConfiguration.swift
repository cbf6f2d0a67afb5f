public import RelayCore
import Foundation
import Yams

/// `host:port` to listen on.
public struct ListenAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// The whole configuration (docs/configuration.md). Loaded once at startup; every problem is reported with
/// the key that has it.
public struct RelayConfiguration: Sendable {
    /// Which record log the stages run on.
    public var log: Log

    /// The relay's consumer groups and the topics each reads: `relay-worker` the notifications,
    /// `relay-deliverer` the deliveries and retry topics, `relay-backend` the events (the local backend's events store).
    public var consumerGroups: [(group: String, topics: [String])] {
        [
            ("relay-worker", [topics.notifications]),
            ("relay-deliverer", topics.delivererTopics(retrySteps: delivery.retrySchedule.count)),
            // The local backend's events store (its EventRecorder).
            ("relay-backend", [topics.events]),
        ]
    }
    /// The topic names, the same on either log (`topics`, or as before `kafka.topics`).
    public var topics: Topics
    public var kafka: Kafka
    public var ingest: Ingest
    public var metrics: Metrics
    public var backend: Backend
    public var apps: [App]
    public var endpoints: [Endpoint]
    public var worker: Worker
    public var delivery: Delivery
    public var money: Money
    /// How long a graceful shutdown (SIGTERM/SIGINT) may take before remaining work is cancelled:
    /// stop intake, finish in-flight work, commit offsets, leave the group. Default: 30 s.
    public var shutdownTimeout: Duration

    public struct Kafka: Sendable {
        /// Default: `127.0.0.1:9092`. `dev` ignores it; `--bootstrap-servers` overrides it.
        public var bootstrapServers: String = "127.0.0.1:9092"
        /// Raw librdkafka settings, passed through. Default: none.
        public var properties: [String: String] = [:]
    }

    /// `log`: Kafka for a cluster, or the embedded durable log for one machine.
    public struct Log: Sendable {
        public enum Kind: String, Sendable, CaseIterable {
            case kafka, embedded
        }

        /// Default: kafka.
        public var kind: Kind = .kafka
        /// The embedded log's data directory (one process owns it). Default: `/var/lib/revenue-relay/log`.
        public var path = "/var/lib/revenue-relay/log"
        /// Partitions of each topic on the embedded log (records placed by key hash). Default: 6.
        public var partitions = 6
        /// How long the embedded log keeps a record of a topic other than the dead-letter topic and the
        /// replay ledger (those are kept until their size bound). Default: 7 days.
        public var retention: Duration = .seconds(7 * 86_400)
        /// The most bytes of record keys, values and headers the embedded log keeps per partition; the oldest
        /// go first. Default: 1 GiB.
        public var retentionBytes: Int64 = 1 << 30
    }

    public struct Topics: Sendable {
        public var notifications = "relay.notifications"
        public var rejected = "relay.notifications.rejected"
        public var events = "relay.events"
        public var deliveries = "relay.deliveries"
        public var retryPrefix = "relay.deliveries.retry"
        public var deadLetter = "relay.deliveries.dlq"
        /// `replay`'s ledger of dead-letter records already re-driven (a compacted topic).
        public var replayed = "relay.deliveries.dlq.replayed"

        /// The retry topic of step `step` of the retry schedule, counted from 1: `relay.deliveries.retry.1`
        /// holds the deliveries waiting for their second attempt.
        public func retry(step: Int) -> String { "\(retryPrefix).\(step)" }

        /// The topics the deliverer consumes: the deliveries topic and one retry topic per step.
        public func delivererTopics(retrySteps: Int) -> [String] {
            [deliveries] + (0..<retrySteps).map { retry(step: $0 + 1) }
        }

        /// Every topic the pipeline uses, given the retry schedule's length.
        public func all(retrySteps: Int) -> [String] {
            [notifications, rejected, events, deliveries, deadLetter, replayed] + (0..<retrySteps).map { retry(step: $0 + 1) }
        }
    }

    public struct Ingest: Sendable {
        /// Default: `127.0.0.1:8080`. Also serves `/health/*` and `/metrics` on every role.
        public var listen = ListenAddress(host: "127.0.0.1", port: 8080)
        /// Larger bodies get 413. Default: 262144 (256 KiB).
        public var maxBodyBytes = 262_144
        /// How long a request may wait for the broker's acknowledgement before it gets 503. Default: 10 s.
        public var ackTimeout: Duration = .seconds(10)
        /// A connection with no request activity for this long is closed: a kept-alive connection between
        /// requests, and one that has not finished sending its headers. Default: 15 s.
        public var idleTimeout: Duration = .seconds(15)
        /// A request whose body has not fully arrived this long after its headers is closed. Default: 30 s.
        public var requestTimeout: Duration = .seconds(30)
        /// Open connections at most; beyond it new ones wait in the listen backlog until one closes, so a
        /// flood of idle clients cannot use up the process's file descriptors. Default: 512.
        public var maxConnections = 512
        /// The operator's proxies and load balancers (CIDR ranges): only from these peers is
        /// `X-Forwarded-For` believed, read from the right, to find the client's address. Default: none
        /// (the TCP peer is the client).
        public var trustedProxies: [AddressRange] = []
        /// What one client address may do (`clientLimit`).
        public var clientLimit = ClientLimit()
        /// Per store, the only source ranges its notifications are taken from (403 otherwise). Default:
        /// none (any source; the worker verifies every notification anyway).
        public var allowedSources: [Store: [AddressRange]] = [:]

        public init() {}

        /// What one client address (an IPv6 client by its /64) may send to the store routes.
        public struct ClientLimit: Sendable {
            /// Requests a second on average; 0 turns the limit off. Default: 100.
            public var requestsPerSecond: Double = 100
            /// Requests at once after being idle. Default: 1000.
            public var burst = 1_000
            /// Bytes written to the log and not yet processed by the worker; 0 turns the bound off.
            /// Default: 16777216 (16 MiB).
            public var unverifiedBytes: Int64 = 16 * 1024 * 1024

            public init() {}
        }
    }

    public struct Metrics: Sendable {
        /// Where `/metrics` is served instead of `ingest.listen`, so it stays off the public port.
        /// Unset (default): on `ingest.listen`.
        public var listen: ListenAddress?

        public init() {}
    }

    public struct Backend: Sendable {
        public var url = "http://127.0.0.1:8081"
        /// The secret key: every route of the local backend, and what the relay's own roles and commands
        /// send (`Authorization: Bearer`) to `url`.
        public var apiKey: String?
        /// More secret keys the local backend accepts, for rotation (each opens every route too).
        public var apiKeys: [String] = []
        /// Read keys: the GET routes of events, revenue and the subscriptions list, for the named apps' rows only.
        public var readKeys: [ReadKey] = []
        /// How often one client may call the public routes (and how often it may present a key the
        /// backend does not know). Default: 20 requests a second, bursts of 200.
        public var publicRateLimit = RateLimit()
        public var database = "backend.sqlite"
        public var listen = ListenAddress(host: "127.0.0.1", port: 8081)
        public var entitlementsTTL: Duration = .seconds(60)

        public init() {}

        /// The longest key, in bytes: keys are compared over this length, whatever theirs.
        public static let maximumKeyLength = 256

        /// Every secret key the local backend accepts: `apiKey`, then `apiKeys`.
        public var secretKeys: [String] { (apiKey.map { [$0] } ?? []) + apiKeys }

        /// The key the relay's roles and commands send: `apiKey`, else the first of `apiKeys`.
        public var clientKey: String? { apiKey ?? apiKeys.first }

        /// `backend.readKeys[]`: a key for BI tools and analysts.
        public struct ReadKey: Sendable {
            public var key: String
            /// The app keys whose rows the key reads (at least one).
            public var apps: [String]

            public init(key: String, apps: [String]) {
                self.key = key
                self.apps = apps
            }
        }

        /// `backend.publicRateLimit`: a token bucket per client.
        public struct RateLimit: Sendable {
            /// Requests a second one client may make on average; 0 turns the limit off. Default: 20.
            public var requestsPerSecond: Double = 20
            /// Requests one client may make at once after being idle. Default: 200.
            public var burst = 200
            /// A header the operator's proxy sets to the client's address (`X-Forwarded-For`: its last
            /// entry is used, the one the proxy added). Unset (default): the TCP peer's address.
            public var clientAddressHeader: String?

            public init() {}
        }
    }

    public struct App: Sendable {
        public var key: String
        public var projectId: Int
        public var applicationId: Int
        public var apple: Apple?
        public var google: Google?
        public var stripe: Stripe?
        public var paddle: Paddle?
        public var products: [Product]
        /// The keys the app embeds (public: anyone who unpacks the app has them): the public routes, for
        /// this app's users and products only.
        public var publicApiKeys: [String] = []

        /// Whether this app receives notifications from `store`.
        public func accepts(_ store: Store) -> Bool {
            switch store {
            case .apple: apple != nil
            case .google: google != nil
            case .stripe: stripe != nil
            case .paddle: paddle != nil
            }
        }
    }

    public struct Apple: Sendable {
        public var bundleId: String
        public var appAppleId: Int64?
        /// Among `Sandbox`, `Production`, `Xcode`, `LocalTesting`.
        public var environments: [String]
        /// Absolute paths of DER or PEM root certificates.
        public var rootCertificates: [String]
        /// The App Store Server API (`import apple`, `recover apple`, `reconcile apple`, consumption answers).
        public var serverApi: AppStoreServerAPI?
        /// How to answer CONSUMPTION_REQUEST notifications; nil: they are not answered.
        public var consumption: ConsumptionAnswer?
        /// Paid-app customers who keep access (`POST .../users/{id}/app-transaction`).
        public var grandfathering: [GrandfatheringRule]

        public init(
            bundleId: String, appAppleId: Int64?, environments: [String], rootCertificates: [String], serverApi: AppStoreServerAPI? = nil,
            consumption: ConsumptionAnswer? = nil, grandfathering: [GrandfatheringRule] = []
        ) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environments = environments
            self.rootCertificates = rootCertificates
            self.serverApi = serverApi
            self.consumption = consumption
            self.grandfathering = grandfathering
        }
    }

    /// An App Store Connect API key for the App Store Server API (`apps[].apple.serverApi`).
    public struct AppStoreServerAPI: Sendable {
        /// The key's id (10 characters, from App Store Connect → Users and Access → Integrations).
        public var keyId: String
        /// The issuer id (a UUID) shown above the keys.
        public var issuerId: String
        /// The absolute path of the downloaded `SubscriptionKey_<keyId>.p8`.
        public var privateKey: String
        /// `Production` or `Sandbox`: which App Store the API calls reach.
        public var environment: String
        /// Overrides Apple's URL for the environment (a proxy; tests).
        public var baseUrl: String?

        public init(keyId: String, issuerId: String, privateKey: String, environment: String = "Production", baseUrl: String? = nil) {
            self.keyId = keyId
            self.issuerId = issuerId
            self.privateKey = privateKey
            self.environment = environment
            self.baseUrl = baseUrl
        }
    }

    /// What the relay tells Apple when a customer asks for a refund (`apps[].apple.consumption`), sent
    /// with Send Consumption Information for each CONSUMPTION_REQUEST. Off unless configured.
    public struct ConsumptionAnswer: Sendable {
        /// The customer agreed to share consumption data (your terms must say so): Apple refuses the answer otherwise.
        public var customerConsented: Bool
        /// Whether the app offers a free trial or sample of what was bought.
        public var sampleContentProvided: Bool
        /// `DECLINE`, `GRANT_FULL`, `GRANT_PRORATED`, or nil to state no preference.
        public var refundPreference: String?

        public init(customerConsented: Bool, sampleContentProvided: Bool = false, refundPreference: String? = nil) {
            self.customerConsented = customerConsented
            self.sampleContentProvided = sampleContentProvided
            self.refundPreference = refundPreference
        }
    }

    /// Entitlements granted without a subscription to a customer whose signed AppTransaction meets the
    /// rule: who bought the app before it became free with subscriptions (`apps[].apple.grandfathering`).
    /// Each condition given must hold.
    public struct GrandfatheringRule: Sendable {
        public var entitlements: [String]
        /// The app version (`CFBundleVersion` on iOS) first downloaded was below this one, compared as
        /// dot-separated numbers (`2.0` > `1.9.3`).
        public var originalAppVersionBelow: String?
        /// The app was first downloaded before this time (Unix milliseconds).
        public var purchasedBefore: Int64?

        public init(entitlements: [String], originalAppVersionBelow: String? = nil, purchasedBefore: Int64? = nil) {
            self.entitlements = entitlements
            self.originalAppVersionBelow = originalAppVersionBelow
            self.purchasedBefore = purchasedBefore
        }
    }

    public struct Google: Sendable {
        public var packageName: String
        public var pushAudience: String
        public var pushServiceAccount: String
        /// An absolute file path or an `https://` URL.
        public var jwks: String
        public var playApi: PlayAPI?
    }

    public struct PlayAPI: Sendable {
        public var baseUrl: String = "https://androidpublisher.googleapis.com"
        public var tokenUrl: String = "https://oauth2.googleapis.com/token"
        public var serviceAccountKey: String?

        public init(baseUrl: String = "https://androidpublisher.googleapis.com", tokenUrl: String = "https://oauth2.googleapis.com/token", serviceAccountKey: String? = nil) {
            self.baseUrl = baseUrl
            self.tokenUrl = tokenUrl
            self.serviceAccountKey = serviceAccountKey
        }
    }

    /// What a valid configuration still loses, each with the key to set: logged as warnings at startup by
    /// the roles it concerns (the worker).
    public var warnings: [ConfigurationError] {
        apps.enumerated().compactMap { index, app in
            guard let stripe = app.stripe, !stripe.signingSecrets.isEmpty, stripe.api == nil else { return nil }
            return ConfigurationError(
                key: "apps[\(index)].stripe.api",
                message: "not set for app \(app.key): a Stripe refund (charge.refunded) then names no subscription, product or user, so it cannot "
                    + "revoke access and its refund event carries no app user; set api.secretKey to a restricted key that may read charges and invoices")
        }
    }

    public struct Stripe: Sendable {
        public var signingSecrets: [String]
        public var tolerance: Duration = .seconds(300)
        /// Stripe's API, read to find the subscription of a refunded charge; refunds stand alone without it.
        public var api: StripeAPI?
    }

    public struct StripeAPI: Sendable {
        public var baseUrl: String = "https://api.stripe.com"
        /// A secret or restricted key (`sk_…`, `rk_…`) that may read charges and invoices.
        public var secretKey: String

        public init(baseUrl: String = "https://api.stripe.com", secretKey: String) {
            self.baseUrl = baseUrl
            self.secretKey = secretKey
        }
    }

    public struct Paddle: Sendable {
        public var secretKeys: [String]
        public var tolerance: Duration = .seconds(300)
        /// Paddle's events do not say whether they come from its sandbox: `PRODUCTION` (default) or `SANDBOX`.
        public var environment = "PRODUCTION"
    }

    public struct Product: Sendable {
        public var productId: String
        public var store: String
        public var entitlements: [String]
    }

    public struct Endpoint: Sendable {
        public var id: String
        public var app: String
        public var url: String
        public var secrets: [String]
        public var events: [String]
        public var environments: [String]
    }

    /// `worker`: how much it works on at once.
    public struct Worker: Sendable {
        /// Notifications read and not yet done, over all subscriptions (the worker runs different
        /// subscriptions' notifications concurrently, one subscription's in order). Default: 256.
        public var maxInFlight = 256
    }

    public struct Delivery: Sendable {
        public var timeout: Duration = .seconds(15)
        public var retrySchedule: [Duration] = [.seconds(5), .seconds(300), .seconds(1800), .seconds(7200), .seconds(18000), .seconds(36000), .seconds(36000)]
        public var maxInFlight = 1024
        public var maxInFlightPerEndpoint = 64
        public var allowPrivateNetworks = false
        /// Whether endpoints may use plain `http://`. Unset: allowed exactly when `allowPrivateNetworks` is
        /// true (development); production endpoints use `https://`.
        public var allowHttp: Bool?

        /// Whether `http://` endpoint URLs are allowed.
        public var httpAllowed: Bool { allowHttp ?? allowPrivateNetworks }
    }

    public struct Money: Sendable {
        public var exchangeRates: String?
        public var commission: [String: Double] = ["APP_STORE": 0.30, "APP_STORE_SMALL_BUSINESS": 0.15, "PLAY_STORE": 0.15, "STRIPE": 0.0, "PADDLE": 0.05]
        public var smallBusiness = false

        public init() {}
    }

    /// The app with this key, if configured.
    public func app(_ key: String) -> App? { apps.first { $0.key == key } }

    /// The apps by key, for a stage that looks one up per request or record (keys are unique: the
    /// parser refuses a duplicate).
    public static func appsByKey(_ apps: [App]) -> [String: App] {
        Dictionary(apps.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
    }
}

extension RelayConfiguration {
    /// Loads and validates a configuration file.
    public static func load(path: String, environment: [String: String]? = nil) throws(ConfigurationError) -> RelayConfiguration {
        let url = URL(fileURLWithPath: path)
        let text: String
        do {
            text = try String(contentsOf: url, encoding: .utf8)
        } catch {
            throw ConfigurationError(key: "", message: "cannot read \(path): \(error.localizedDescription)")
        }
        let base = url.standardizedFileURL.deletingLastPathComponent().path
        do {
            return try parse(yaml: text, baseDirectory: base, environment: environment ?? ProcessInfo.processInfo.environment)
        } catch {
            // Which file, for an operator with several.
            throw ConfigurationError(key: error.key, message: "\(error.message) (in \(path))")
        }
    }

    /// What a YAML error says, without the file's text (it may hold secrets): where, and what.
    static func describe(yamlError error: any Error) -> String {
        guard let error = error as? YamlError else { return "not valid YAML" }
        switch error {
        case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _), .composer(_, let problem, let mark, _):
            return "not valid YAML at line \(mark.line), column \(mark.column): \(problem)"
        case .reader(let problem, let offset, _, _):
            return "not valid YAML: \(problem)\(offset.map { " at byte \($0)" } ?? "")"
        case .duplicatedKeysInMapping(let duplicates, let context):
            return "a key appears more than once in one mapping (near line \(context.mark.line)): \(duplicates.sorted().joined(separator: ", "))"
        default:
            return "not valid YAML"
        }
    }

    /// Parses configuration text; relative paths resolve against `baseDirectory`.
    public static func parse(yaml: String, baseDirectory: String, environment: [String: String]) throws(ConfigurationError) -> RelayConfiguration {
        let root: Yams.Node
        do {
            guard let parsed = try Yams.compose(yaml: yaml) else { throw ConfigurationError(key: "", message: "the file is empty") }
            root = parsed
        } catch let error as ConfigurationError {
            throw error
        } catch {
            // Never the error's own text: Yams quotes the file around the problem, secrets included.
            throw ConfigurationError(key: "", message: describe(yamlError: error))
        }
        let context = ConfigContext(environment: environment, baseDirectory: baseDirectory)
        let node = ConfigNode(node: root, path: "", context: context)
        let configuration: RelayConfiguration
        do {
            configuration = try ConfigParser.configuration(node)
        } catch {
            // An unset variable explains what its placeholder text then failed; report the variables.
            if let missing = missingError(context.missing, yaml: yaml, environment: environment) { throw missing }
            throw error
        }
        if let missing = missingError(context.missing, yaml: yaml, environment: environment) { throw missing }
        return configuration
    }

    /// Every unset `${NAME}` at once, in file order, with its line and, where the walk reached it, its key
    /// (an earlier error can stop the walk; the text still names them all). The error's key is the first's.
    private static func missingError(_ walked: MissingVariables, yaml: String, environment: [String: String]) -> ConfigurationError? {
        var entries = missingEnvironmentVariables(in: yaml, environment: environment).map { found in
            (name: found.name, line: found.line, key: walked.entries.first { $0.name == found.name && $0.line == found.line }?.key)
        }
        // A value the text scan could not see (a block scalar's later line) but the walk did.
        for entry in walked.entries where !entries.contains(where: { $0.name == entry.name && $0.key == entry.key }) {
            entries.append((entry.name, entry.line ?? 0, entry.key))
        }
        guard let first = entries.first else { return nil }
        let list = entries.map { entry in "\(entry.name) (\(entry.key.map { "\($0), " } ?? "")line \(entry.line))" }
        return ConfigurationError(
            key: first.key ?? "", message: "environment variable\(entries.count == 1 ? "" : "s") not set: \(list.joined(separator: "; "))")
    }

    /// Every `${NAME}` occurrence the text uses that `environment` lacks, in file order with its line.
    /// Comments (from ` #` or a line's leading `#`) are skipped.
    static func missingEnvironmentVariables(in yaml: String, environment: [String: String]) -> [(name: String, line: Int)] {
        var missing: [(name: String, line: Int)] = []
        for (index, line) in yaml.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var content = Substring(line)
            if content.drop(while: { $0 == " " }).hasPrefix("#") { continue }
            if let comment = content.range(of: " #") { content = content[..<comment.lowerBound] }
            var rest = content
            while let start = rest.range(of: "${") {
                guard let end = rest[start.upperBound...].firstIndex(of: "}") else { break }
                let name = String(rest[start.upperBound..<end])
                if !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }), environment[name] == nil,
                    !missing.contains(where: { $0.name == name && $0.line == index + 1 })
                {
                    missing.append((name, index + 1))
                }
                rest = rest[rest.index(after: end)...]
            }
        }
        return missing
    }
}
