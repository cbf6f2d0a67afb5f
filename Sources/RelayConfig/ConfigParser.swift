import Foundation
import RelayCore

/// Reads each section of docs/configuration.md into the typed configuration.
enum ConfigParser {
    static func configuration(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration {
        let root = try node.mapping(
            known: ["log", "topics", "kafka", "ingest", "metrics", "backend", "apps", "endpoints", "worker", "delivery", "money", "shutdownTimeout"])
        let apps = try root.optional("apps") { (node) throws(ConfigurationError) in try list(node, app) } ?? []
        var seen = Set<String>()
        var applications: [Int: Int] = [:]
        for (index, app) in apps.enumerated() {
            guard seen.insert(app.key).inserted else { throw ConfigurationError(key: "apps[\(index)].key", message: "duplicate app key") }
            // The backend keeps customers, products and keys apart by applicationId (a subscription's
            // state names its application), so two apps sharing one would see each other's customers.
            if let other = applications.updateValue(index, forKey: app.applicationId) {
                throw ConfigurationError(
                    key: "apps[\(index)].applicationId",
                    message: "apps[\(other)] has this applicationId too; each app needs its own (its customers and keys are kept apart by it)")
            }
        }
        let endpoints = try root.optional("endpoints") { (node) throws(ConfigurationError) in try list(node, endpoint) } ?? []
        var endpointIDs = Set<String>()
        for (index, endpoint) in endpoints.enumerated() {
            guard endpointIDs.insert(endpoint.id).inserted else {
                throw ConfigurationError(key: "endpoints[\(index)].id", message: "duplicate endpoint id")
            }
            guard seen.contains(endpoint.app) else {
                throw ConfigurationError(key: "endpoints[\(index)].app", message: "no app with this key is configured")
            }
        }
        let delivery = try root.optional("delivery", delivery) ?? .init()
        for (index, endpoint) in endpoints.enumerated() where !delivery.httpAllowed && endpoint.url.lowercased().hasPrefix("http://") {
            throw ConfigurationError(
                key: "endpoints[\(index)].url",
                message: "webhooks go to https:// endpoints; plain http:// needs delivery.allowHttp: true (or allowPrivateNetworks: true, for development)")
        }
        let kafka = try root.optional("kafka", kafka) ?? (kafka: .init(), topics: nil)
        let topics = try root.optional("topics", topics)
        if topics != nil, kafka.topics != nil {
            throw ConfigurationError(key: "kafka.topics", message: "set the topic names once: under topics (kafka.topics is the earlier place)")
        }
        let ingest = try root.optional("ingest", ingest) ?? .init()
        let metrics = try root.optional("metrics", metrics) ?? .init()
        let backend = try root.optional("backend", backend) ?? .init()
        try checkKeysAreDistinct(backend: backend, apps: apps)
        if let metricsListen = metrics.listen, metricsListen.port != 0,
            [ingest.listen, backend.listen].contains(where: { $0.port == metricsListen.port && ($0.host == metricsListen.host || $0.host == "0.0.0.0" || metricsListen.host == "0.0.0.0") })
        {
            throw ConfigurationError(key: "metrics.listen", message: "\(metricsListen) is also ingest.listen or backend.listen: give metrics its own port")
        }
        return RelayConfiguration(
            log: try root.optional("log", log) ?? .init(),
            topics: topics ?? kafka.topics ?? .init(),
            kafka: kafka.kafka,
            ingest: ingest,
            metrics: metrics,
            backend: backend,
            apps: apps,
            endpoints: endpoints,
            worker: try root.optional("worker", worker) ?? .init(),
            delivery: delivery,
            money: try root.optional("money", money) ?? .init(),
            shutdownTimeout: try root.optional("shutdownTimeout") { (node) throws(ConfigurationError) in try node.duration() } ?? .seconds(30)
        )
    }

    static func list<T>(_ node: ConfigNode, _ read: (ConfigNode) throws(ConfigurationError) -> T) throws(ConfigurationError) -> [T] {
        var result: [T] = []
        for element in try node.sequence() { result.append(try read(element)) }
        return result
    }

    static func kafka(_ node: ConfigNode) throws(ConfigurationError) -> (kafka: RelayConfiguration.Kafka, topics: RelayConfiguration.Topics?) {
        let map = try node.mapping(known: ["bootstrapServers", "properties", "topics"])
        var kafka = RelayConfiguration.Kafka()
        if let value = try map.optional("bootstrapServers", { (node) throws(ConfigurationError) in try node.nonEmptyString() }) { kafka.bootstrapServers = value }
        if let value = try map.optional("properties", { (node) throws(ConfigurationError) in try node.stringMap() }) { kafka.properties = value }
        return (kafka, try map.optional("topics", topics))
    }

    static func topics(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Topics {
        let map = try node.mapping(known: ["notifications", "rejected", "events", "deliveries", "retryPrefix", "deadLetter", "replayed", "attempts"])
        var topics = RelayConfiguration.Topics()
        func topic(_ key: String, _ keyPath: WritableKeyPath<RelayConfiguration.Topics, String>) throws(ConfigurationError) {
            if let value = try map.optional(key, { (node) throws(ConfigurationError) in try node.nonEmptyString() }) {
                topics[keyPath: keyPath] = value
            }
        }
        try topic("notifications", \.notifications)
        try topic("rejected", \.rejected)
        try topic("events", \.events)
        try topic("deliveries", \.deliveries)
        try topic("retryPrefix", \.retryPrefix)
        try topic("deadLetter", \.deadLetter)
        try topic("replayed", \.replayed)
        try topic("attempts", \.attempts)
        return topics
    }

    static func log(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Log {
        let map = try node.mapping(known: ["kind", "path", "partitions", "retention", "retentionBytes", "commitInterval"])
        var log = RelayConfiguration.Log()
        if let kind = try map.optional("kind", { (node) throws(ConfigurationError) in try node.nonEmptyString() }) {
            guard let value = RelayConfiguration.Log.Kind(rawValue: kind) else {
                throw ConfigurationError(key: "log.kind", message: "expected kafka or embedded")
            }
            log.kind = value
        }
        if let value = try map.optional("path", { (node) throws(ConfigurationError) in try node.path(mustExist: false) }) { log.path = value }
        if let value = try map.optional("partitions", { (node) throws(ConfigurationError) in try node.int(in: 1...1024) }) { log.partitions = value }
        if let value = try map.optional("retention", { (node) throws(ConfigurationError) in try positive(node) }) { log.retention = value }
        if let value = try map.optional("retentionBytes", { (node) throws(ConfigurationError) in try node.int(in: 1_048_576...Int.max) }) {
            log.retentionBytes = Int64(value)
        }
        if let value = try map.optional("commitInterval", { (node) throws(ConfigurationError) in try commitInterval(node) }) { log.commitInterval = value }
        return log
    }

    static func ingest(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Ingest {
        let map = try node.mapping(
            known: ["listen", "maxBodyBytes", "ackTimeout", "idleTimeout", "requestTimeout", "maxConnections", "trustedProxies", "clientLimit", "allowedSources"])
        var ingest = RelayConfiguration.Ingest()
        if let value = try map.optional("listen", { (node) throws(ConfigurationError) in try node.listenAddress() }) { ingest.listen = value }
        if let value = try map.optional("maxBodyBytes", { (node) throws(ConfigurationError) in try node.int(in: 1...64 * 1024 * 1024) }) { ingest.maxBodyBytes = value }
        if let value = try map.optional("ackTimeout", { (node) throws(ConfigurationError) in try positive(node) }) { ingest.ackTimeout = value }
        if let value = try map.optional("idleTimeout", positive) { ingest.idleTimeout = value }
        if let value = try map.optional("requestTimeout", positive) { ingest.requestTimeout = value }
        if let value = try map.optional("maxConnections", { (node) throws(ConfigurationError) in try node.int(in: 1...1_000_000) }) { ingest.maxConnections = value }
        if let value = try map.optional("trustedProxies", addressRanges) { ingest.trustedProxies = value }
        if let value = try map.optional("clientLimit", clientLimit) { ingest.clientLimit = value }
        if let value = try map.optional("allowedSources", allowedSources) { ingest.allowedSources = value }
        return ingest
    }

    /// `ingest.allowedSources`: per store, the CIDR ranges its notifications are taken from.
    static func allowedSources(_ node: ConfigNode) throws(ConfigurationError) -> [Store: [AddressRange]] {
        let map = try node.mapping(known: ["apple", "google", "stripe", "paddle"])
        var sources: [Store: [AddressRange]] = [:]
        for store in Store.notificationStores {
            guard let ranges = try map.optional(store.rawValue, addressRanges) else { continue }
            guard !ranges.isEmpty else {
                throw ConfigurationError(key: "\(node.path).\(store.rawValue)", message: "name at least one range, or leave \(store.rawValue) out to take any source")
            }
            sources[store] = ranges
        }
        return sources
    }

    /// A list of CIDR ranges (`17.0.0.0/8`, `2001:db8::/32`) or single addresses.
    static func addressRanges(_ node: ConfigNode) throws(ConfigurationError) -> [AddressRange] {
        try list(node) { (node) throws(ConfigurationError) -> AddressRange in
            let text = try node.nonEmptyString()
            guard let range = AddressRange(text) else { throw node.error("expected an IP address or CIDR range (17.0.0.0/8, 2001:db8::/32)") }
            return range
        }
    }

    static func clientLimit(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Ingest.ClientLimit {
        let map = try node.mapping(known: ["requestsPerSecond", "burst", "unverifiedBytes"])
        var limit = RelayConfiguration.Ingest.ClientLimit()
        if let value = try map.optional("requestsPerSecond", requestRate) { limit.requestsPerSecond = value }
        if let value = try map.optional("burst", { (node) throws(ConfigurationError) in try node.int(in: 1...1_000_000) }) { limit.burst = value }
        if let value = try map.optional("unverifiedBytes", { (node) throws(ConfigurationError) -> Int in
            let value = try node.int(in: 0...Int.max)
            guard value == 0 || value >= 65_536 else { throw node.error("expected at least 65536 bytes (0 turns the bound off)") }
            return value
        }) { limit.unverifiedBytes = Int64(value) }
        return limit
    }

    /// Requests a second: a number, at least 0.001, or 0 (no limit).
    static func requestRate(_ node: ConfigNode) throws(ConfigurationError) -> Double {
        guard let number = Double(try node.string()), number.isFinite, number == 0 || number >= 0.001 else {
            throw node.error("expected a number of requests a second, at least 0.001 (0 turns the limit off)")
        }
        return number
    }

    static func metrics(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Metrics {
        let map = try node.mapping(known: ["listen"])
        var metrics = RelayConfiguration.Metrics()
        metrics.listen = try map.optional("listen", { (node) throws(ConfigurationError) in try node.listenAddress() })
        return metrics
    }

    static func positive(_ node: ConfigNode) throws(ConfigurationError) -> Duration {
        let value = try node.duration()
        guard value > .zero else { throw node.error("must be greater than zero") }
        return value
    }

    /// `log.commitInterval`, `backend.commitInterval`: 0 (commit at once) to 100 ms (a write waits at most this more).
    static func commitInterval(_ node: ConfigNode) throws(ConfigurationError) -> Duration {
        let value = try node.duration()
        guard value >= .zero, value <= .milliseconds(100) else { throw node.error("must be between 0ms and 100ms") }
        return value
    }

    static func backend(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Backend {
        let map = try node.mapping(
            known: ["url", "apiKey", "apiKeys", "readKeys", "publicRateLimit", "database", "listen", "entitlementsTTL", "deliveryLog", "commitInterval"])
        var backend = RelayConfiguration.Backend()
        if let value = try map.optional("url", { (node) throws(ConfigurationError) in try httpURL(node) }) { backend.url = value }
        backend.apiKey = try map.optional("apiKey") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
        backend.apiKeys = try map.optional("apiKeys") { (node) throws(ConfigurationError) in try keyList(node) } ?? []
        backend.readKeys = try map.optional("readKeys") { (node) throws(ConfigurationError) in
            try list(node) { (node) throws(ConfigurationError) -> RelayConfiguration.Backend.ReadKey in
                let map = try node.mapping(known: ["key", "apps"])
                let apps = try map.required("apps") { (node) throws(ConfigurationError) in try node.stringList() }
                guard !apps.isEmpty else { throw ConfigurationError(key: "\(node.path).apps", message: "name at least one app key whose rows the key reads") }
                return .init(key: try map.required("key") { (node) throws(ConfigurationError) in try node.nonEmptyString() }, apps: apps)
            }
        } ?? []
        if let value = try map.optional("publicRateLimit", publicRateLimit) { backend.publicRateLimit = value }
        if let value = try map.optional("database", { (node) throws(ConfigurationError) in try node.path(mustExist: false) }) { backend.database = value }
        if let value = try map.optional("listen", { (node) throws(ConfigurationError) in try node.listenAddress() }) { backend.listen = value }
        if let value = try map.optional("entitlementsTTL", { (node) throws(ConfigurationError) in try node.duration() }) { backend.entitlementsTTL = value }
        if let value = try map.optional("commitInterval", { (node) throws(ConfigurationError) in try commitInterval(node) }) { backend.commitInterval = value }
        if let value = try map.optional("deliveryLog", { (node) throws(ConfigurationError) -> RelayConfiguration.Backend.DeliveryLogLimits in
            let map = try node.mapping(known: ["retention", "maxAttempts"])
            var limits = RelayConfiguration.Backend.DeliveryLogLimits()
            if let value = try map.optional("retention", { (node) throws(ConfigurationError) in try node.duration() }) { limits.retention = value }
            if let value = try map.optional("maxAttempts", { (node) throws(ConfigurationError) in try node.int(in: 1_000...1_000_000_000) }) { limits.maxAttempts = value }
            return limits
        }) { backend.deliveryLog = value }
        return backend
    }

    /// A list of keys, each a non-empty string.
    static func keyList(_ node: ConfigNode) throws(ConfigurationError) -> [String] {
        try list(node) { (node) throws(ConfigurationError) in try node.nonEmptyString() }
    }

    static func publicRateLimit(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Backend.RateLimit {
        let map = try node.mapping(known: ["requestsPerSecond", "burst", "clientAddressHeader", "trustedProxies"])
        var limit = RelayConfiguration.Backend.RateLimit()
        if let value = try map.optional("requestsPerSecond", requestRate) { limit.requestsPerSecond = value }
        if let value = try map.optional("burst", { (node) throws(ConfigurationError) in try node.int(in: 1...1_000_000) }) { limit.burst = value }
        limit.clientAddressHeader = try map.optional("clientAddressHeader") { (node) throws(ConfigurationError) -> String in
            let name = try node.nonEmptyString()
            guard name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { throw node.error("expected a header name") }
            return name
        }
        if let value = try map.optional("trustedProxies", addressRanges) { limit.trustedProxies = value }
        return limit
    }

    /// Each key string is configured once: in one kind (secret, read, public) and one app. A key in two
    /// places would give one holder the scope of the other. Names both places, never the key.
    static func checkKeysAreDistinct(backend: RelayConfiguration.Backend, apps: [RelayConfiguration.App]) throws(ConfigurationError) {
        var places: [(place: String, key: String)] = []
        if let key = backend.apiKey { places.append(("backend.apiKey", key)) }
        places += backend.apiKeys.enumerated().map { ("backend.apiKeys[\($0)]", $1) }
        places += backend.readKeys.enumerated().map { ("backend.readKeys[\($0)].key", $1.key) }
        for (index, app) in apps.enumerated() {
            places += app.publicApiKeys.enumerated().map { ("apps[\(index)].publicApiKeys[\($0)]", $1) }
        }
        var first: [String: String] = [:]
        for (place, key) in places {
            guard key.utf8.count <= RelayConfiguration.Backend.maximumKeyLength else {
                throw ConfigurationError(key: place, message: "longer than \(RelayConfiguration.Backend.maximumKeyLength) bytes; use a shorter random key")
            }
            if let earlier = first[key] {
                throw ConfigurationError(
                    key: place, message: "the same key is also configured as \(earlier); give each place its own key (a key has one kind and one app)")
            }
            first[key] = place
        }
        let appKeys = Set(apps.map(\.key))
        for (index, readKey) in backend.readKeys.enumerated() {
            for (appIndex, app) in readKey.apps.enumerated() where !appKeys.contains(app) {
                throw ConfigurationError(key: "backend.readKeys[\(index)].apps[\(appIndex)]", message: "no app with this key is configured")
            }
        }
    }

    static func httpURL(_ node: ConfigNode) throws(ConfigurationError) -> String {
        let text = try node.nonEmptyString()
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https", url.host != nil else {
            throw node.error("expected an http:// or https:// URL")
        }
        return text
    }

    static func endpoint(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Endpoint {
        let map = try node.mapping(known: ["id", "app", "url", "secrets", "events", "environments", "rateLimit"])
        let environments = try map.optional("environments") { (node) throws(ConfigurationError) in try node.stringList() } ?? endpointEnvironments
        for (index, environment) in environments.enumerated() where !endpointEnvironments.contains(environment) {
            throw ConfigurationError(key: "\(node.path).environments[\(index)]", message: "expected PRODUCTION or SANDBOX")
        }
        let secrets = try map.required("secrets", secrets)
        for (index, secret) in secrets.enumerated() {
            guard WebhookSecret.key(secret) != nil else {
                throw ConfigurationError(key: "\(node.path).secrets[\(index)]", message: "expected whsec_ followed by base64 (Standard Webhooks secret)")
            }
        }
        return RelayConfiguration.Endpoint(
            id: try map.required("id") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            app: try map.required("app") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            url: try map.required("url", httpURL),
            secrets: secrets,
            events: try map.optional("events") { (node) throws(ConfigurationError) in try node.stringList() } ?? ["*"],
            environments: environments,
            ratePerSecond: try map.optional("rateLimit", endpointRate))
    }

    /// `rateLimit`: `<n>/s`, `<n>/min` or `<n>/h` (a plain number is per second), more than 0 and at most 100,000/s.
    static func endpointRate(_ node: ConfigNode) throws(ConfigurationError) -> Double {
        let text = try node.nonEmptyString().replacingOccurrences(of: " ", with: "")
        let parts = text.split(separator: "/", maxSplits: 1)
        let per: Double
        switch parts.count == 2 ? String(parts[1]) : "s" {
        case "s", "sec", "second": per = 1
        case "m", "min", "minute": per = 60
        case "h", "hour": per = 3600
        default: throw node.error("expected a rate such as 50/s, 600/min or 1000/h")
        }
        guard let count = Double(parts[0]), count.isFinite, count > 0, count / per <= 100_000 else {
            throw node.error("expected a rate such as 50/s, 600/min or 1000/h (more than 0, at most 100000/s)")
        }
        return count / per
    }

    static func worker(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Worker {
        let map = try node.mapping(known: ["maxInFlight"])
        var worker = RelayConfiguration.Worker()
        if let value = try map.optional("maxInFlight", { (node) throws(ConfigurationError) in try node.int(in: 1...100_000) }) { worker.maxInFlight = value }
        return worker
    }

    static func delivery(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Delivery {
        let map = try node.mapping(known: ["timeout", "retrySchedule", "maxInFlight", "maxInFlightPerEndpoint", "allowPrivateNetworks", "allowHttp"])
        var delivery = RelayConfiguration.Delivery()
        if let value = try map.optional("timeout", positive) { delivery.timeout = value }
        if let value = try map.optional("retrySchedule", { (node) throws(ConfigurationError) in try list(node, positive) }) { delivery.retrySchedule = value }
        if let value = try map.optional("maxInFlight", { (node) throws(ConfigurationError) in try node.int(in: 1...1_000_000) }) { delivery.maxInFlight = value }
        if let value = try map.optional("maxInFlightPerEndpoint", { (node) throws(ConfigurationError) in try node.int(in: 1...1_000_000) }) { delivery.maxInFlightPerEndpoint = value }
        if let value = try map.optional("allowPrivateNetworks", { (node) throws(ConfigurationError) in try node.bool() }) { delivery.allowPrivateNetworks = value }
        if let value = try map.optional("allowHttp", { (node) throws(ConfigurationError) in try node.bool() }) { delivery.allowHttp = value }
        return delivery
    }

    static func money(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Money {
        let map = try node.mapping(known: ["exchangeRates", "commission", "smallBusiness"])
        var money = RelayConfiguration.Money()
        money.exchangeRates = try map.optional("exchangeRates") { (node) throws(ConfigurationError) in try node.path(mustExist: true) }
        if let commissionNode = try map.optional("commission", { $0 }) {
            let known = ["APP_STORE", "APP_STORE_SMALL_BUSINESS", "PLAY_STORE", "STRIPE", "PADDLE"]
            let commission = try commissionNode.mapping(known: known)
            for key in known {
                if let value = try commission.optional(key, { (node) throws(ConfigurationError) -> Double in
                    let value = try node.double()
                    guard (0...1).contains(value) else { throw node.error("must be between 0 and 1") }
                    return value
                }) {
                    money.commission[key] = value
                }
            }
        }
        if let value = try map.optional("smallBusiness", { (node) throws(ConfigurationError) in try node.bool() }) { money.smallBusiness = value }
        return money
    }
}
