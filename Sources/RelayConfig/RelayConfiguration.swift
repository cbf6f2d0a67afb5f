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
    /// `relay-deliverer` the deliveries and retry topics, `relay-backend` the events and the delivery log's attempts (the
    /// local backend's events store and delivery log).
    public var consumerGroups: [(group: String, topics: [String])] {
        [
            ("relay-worker", [topics.notifications]),
            ("relay-deliverer", topics.delivererTopics(retrySteps: delivery.retrySchedule.count)),
            // The local backend's events store and delivery log (its EventRecorder).
            ("relay-backend", [topics.events, topics.attempts]),
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
        /// The shortest time from the start of one of the embedded log's group commits to the next. Default: 5 ms.
        public var commitInterval: Duration = CommitPacing.defaultInterval
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
        /// The delivery log: one record per webhook attempt (`DeliveryAttempt`), which the local backend records.
        public var attempts = "relay.deliveries.attempts"

        /// The retry topic of step `step` of the retry schedule, counted from 1: `relay.deliveries.retry.1`
        /// holds the deliveries waiting for their second attempt.
        public func retry(step: Int) -> String { "\(retryPrefix).\(step)" }

        /// The topics the deliverer consumes: the deliveries topic and one retry topic per step.
        public func delivererTopics(retrySteps: Int) -> [String] {
            [deliveries] + (0..<retrySteps).map { retry(step: $0 + 1) }
        }

        /// Every topic the pipeline uses, given the retry schedule's length.
        public func all(retrySteps: Int) -> [String] {
            [notifications, rejected, events, deliveries, deadLetter, replayed, attempts] + (0..<retrySteps).map { retry(step: $0 + 1) }
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
        /// The shortest time from the start of one commit of the local backend's state writes to the next. Default: 5 ms.
        public var commitInterval: Duration = CommitPacing.defaultInterval
        /// `backend.deliveryLog`: how long webhook attempts are kept, and how many at most.
        public var deliveryLog = DeliveryLogLimits()

        public init() {}

        public struct DeliveryLogLimits: Sendable {
            /// Default: 30 days.
            public var retention: Duration = .seconds(30 * 86_400)
            /// Default: 10,000,000 attempts (the oldest go first).
            public var maxAttempts = 10_000_000

            public init() {}
        }

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
            /// A header the operator's proxy sets to the client's address (`X-Forwarded-For`). With
            /// `trustedProxies`, read from the right through them; without, its last entry from any peer
            /// (only safe when every request comes through the proxy). Unset (default): the TCP peer's address.
            public var clientAddressHeader: String?
            /// The operator's proxies (CIDR ranges): only from these peers is the client address header
            /// believed, read from the right past them (`X-Forwarded-For` when no header is named). Default: none.
            public var trustedProxies: [AddressRange] = []

            public init() {}
        }
    }


    public struct Endpoint: Sendable {
        public var id: String
        public var app: String
        public var url: String
        public var secrets: [String]
        public var events: [String]
        public var environments: [String]
        /// At most this many attempts a second start (`rateLimit`, e.g. `50/s`); nil: no limit but the
        /// in-flight ones.
        public var ratePerSecond: Double?

        public init(
            id: String, app: String, url: String, secrets: [String], events: [String] = ["*"], environments: [String] = ["PRODUCTION", "SANDBOX"],
            ratePerSecond: Double? = nil
        ) {
            self.id = id
            self.app = app
            self.url = url
            self.secrets = secrets
            self.events = events
            self.environments = environments
            self.ratePerSecond = ratePerSecond
        }
    }

    /// `worker`: how much it works on at once.
    public struct Worker: Sendable {
        /// Notifications read and not yet done, over all subscriptions (the worker runs different
        /// subscriptions' notifications concurrently, one subscription's in order). Default: 128, which
        /// keeps a busy relay under 100 MiB on the embedded log at the throughput of 256 (docs/benchmarks.md).
        public var maxInFlight = 128
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
