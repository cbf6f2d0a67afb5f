import Foundation
import RelayConfig
import RelayCore
import Testing

@Suite struct ConfigurationTests {
    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func parse(_ yaml: String, environment: [String: String] = [:]) throws(ConfigurationError) -> RelayConfiguration {
        try RelayConfiguration.parse(yaml: yaml, baseDirectory: Self.repositoryRoot.appendingPathComponent("config").path, environment: environment)
    }

    func error(_ yaml: String, environment: [String: String] = [:]) -> ConfigurationError? {
        do {
            _ = try parse(yaml, environment: environment)
            return nil
        } catch {
            return error
        }
    }

    @Test func anEndpointsRateLimitIsReadPerSecondMinuteOrHourAndBadOnesNameTheirKey() throws {
        func yaml(_ text: String) -> String {
            """
            apps: [{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: [whsec_x] } }]
            endpoints: [{ id: e, app: demo, url: "https://x.test", secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw], rateLimit: "\(text)" }]
            """
        }
        func rate(_ text: String) throws -> Double? { try parse(yaml(text)).endpoints.first?.ratePerSecond }
        #expect(try rate("50/s") == 50)
        #expect(try rate("600/min") == 10)
        #expect(try rate("1800/h") == 0.5)
        #expect(try rate("2.5") == 2.5)
        for bad in ["0/s", "-1/s", "fast", "10/day", "200000/s"] {
            let failure = error(yaml(bad))
            #expect(failure?.key == "endpoints[0].rateLimit", "\(bad): \(String(describing: failure))")
        }
    }

    @Test func devConfigurationLoadsAsShipped() throws {
        let configuration = try RelayConfiguration.load(path: Self.repositoryRoot.appendingPathComponent("config/dev.yaml").path, environment: [:])
        let demo = try #require(configuration.app("demo"))
        #expect(demo.apple?.rootCertificates.first?.hasSuffix("config/certs/AppleRootCA-G3.der") == true)
        #expect(configuration.ingest.listen.description == "127.0.0.1:8080")
        #expect(configuration.delivery.allowPrivateNetworks)
    }

    @Test func exampleConfigurationLoadsWithItsSecretsFromTheEnvironment() throws {
        let environment = ["RELAY_BACKEND_KEY": "k", "ANALYTICS_READ_KEY": "r", "DEMO_PUBLIC_API_KEY": "p", "STRIPE_WEBHOOK_SECRET": "whsec_s", "PADDLE_WEBHOOK_SECRET": "p", "ANALYTICS_WHSEC": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "GOOGLE_SERVICE_ACCOUNT_KEY_FILE": Self.repositoryRoot.appendingPathComponent("Tests/Fixtures/google/service-account.json").path]
        let configuration = try RelayConfiguration.load(path: Self.repositoryRoot.appendingPathComponent("config/example.yaml").path, environment: environment)
        #expect(configuration.app("demo")?.stripe?.signingSecrets == ["whsec_s"])
        #expect(configuration.endpoints.first?.id == "analytics")
        #expect(configuration.endpoints.first?.ratePerSecond == 50)
        #expect(configuration.delivery.allowPrivateNetworks == false)
        #expect(configuration.app("demo")?.apple?.environments.contains("Xcode") == false)
        #expect(configuration.app("demo")?.publicApiKeys == ["p"])
        #expect(configuration.backend.readKeys.map(\.apps) == [["demo"]])
    }

    /// The one-machine production configuration that deploy/systemd/revenue-relay.service runs with every role.
    @Test func oneMachineConfigurationLoadsWithItsSecretsFromTheEnvironment() throws {
        let path = Self.repositoryRoot.appendingPathComponent("config/one-machine.yaml").path
        let environment = ["RELAY_BACKEND_KEY": "k", "ANALYTICS_READ_KEY": "r", "DEMO_PUBLIC_API_KEY": "p", "STRIPE_WEBHOOK_SECRET": "whsec_s", "PADDLE_WEBHOOK_SECRET": "p", "ANALYTICS_WHSEC": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "GOOGLE_SERVICE_ACCOUNT_KEY_FILE": Self.repositoryRoot.appendingPathComponent("Tests/Fixtures/google/service-account.json").path]
        let configuration = try RelayConfiguration.load(path: path, environment: environment)
        // The embedded log and the backend's database, both in the unit's StateDirectory (absolute paths stay as written).
        #expect(configuration.log.kind == .embedded)
        #expect(configuration.log.path == "/var/lib/revenue-relay/log")
        #expect(configuration.backend.database == "/var/lib/revenue-relay/backend.sqlite")
        // The backend role runs in the same process: it needs the secret key, and the tools reach it at backend.url.
        #expect(configuration.backend.apiKey == "k")
        #expect(configuration.backend.url == "http://127.0.0.1:8081")
        #expect(configuration.backend.listen.description == "127.0.0.1:8081")
        #expect(configuration.backend.readKeys.map(\.apps) == [["demo"]])
        #expect(configuration.backend.publicRateLimit.trustedProxies.map(\.description) == ["127.0.0.1/32", "::1/128"])
        // Behind a TLS proxy on the same machine; /metrics off the proxied port.
        #expect(configuration.ingest.listen.description == "127.0.0.1:8080")
        #expect(configuration.metrics.listen?.description == "127.0.0.1:9090")
        #expect(configuration.app("demo")?.stripe?.signingSecrets == ["whsec_s"])
        #expect(configuration.app("demo")?.publicApiKeys == ["p"])
        #expect(configuration.app("demo")?.apple?.environments.contains("Xcode") == false)
        #expect(configuration.endpoints.first?.id == "analytics")
        #expect(configuration.endpoints.first?.ratePerSecond == 50)
        #expect(configuration.delivery.allowPrivateNetworks == false)
        // Its secrets come from the environment only.
        #expect(throws: ConfigurationError.self) { _ = try RelayConfiguration.load(path: path, environment: [:]) }
    }

    @Test func defaultsApplyWhenSectionsAreAbsent() throws {
        let configuration = try parse("kafka: { bootstrapServers: \"broker:9092\" }")
        #expect(configuration.kafka.bootstrapServers == "broker:9092")
        #expect(configuration.topics.notifications == "relay.notifications")
        #expect(configuration.topics.all(retrySteps: 2).contains("relay.deliveries.retry.1"))
        #expect(configuration.ingest.maxBodyBytes == 262_144)
        #expect(configuration.ingest.ackTimeout == .seconds(10))
        #expect(configuration.delivery.timeout == .seconds(15))
        #expect(configuration.delivery.retrySchedule.count == 7)
        #expect(configuration.shutdownTimeout == .seconds(30))
        // The delivery log: its topic, recorded by relay-backend beside the events, kept 30 days and 10 million rows.
        #expect(configuration.topics.attempts == "relay.deliveries.attempts")
        #expect(configuration.topics.all(retrySteps: 2).contains("relay.deliveries.attempts"))
        #expect(configuration.consumerGroups.first { $0.group == "relay-backend" }?.topics == ["relay.events", "relay.deliveries.attempts"])
        #expect(configuration.backend.deliveryLog.retention == .seconds(30 * 86_400))
        #expect(configuration.backend.deliveryLog.maxAttempts == 10_000_000)
    }

    @Test func theDeliveryLogsBoundsAreConfiguredAndChecked() throws {
        let configuration = try parse(#"backend: { deliveryLog: { retention: 48h, maxAttempts: 5000 } }"#)
        #expect(configuration.backend.deliveryLog.retention == .seconds(48 * 3600))
        #expect(configuration.backend.deliveryLog.maxAttempts == 5000)
        #expect(throws: ConfigurationError.self) { try parse(#"backend: { deliveryLog: { maxAttempts: 10 } }"#) }
        #expect(throws: ConfigurationError.self) { try parse(#"backend: { deliveryLog: { keep: 1 } }"#) }
        #expect(try parse(#"topics: { attempts: my.attempts }"#).topics.attempts == "my.attempts")
    }

    @Test func theCommitIntervalsDefaultTo5msAndAreBoundedTo100ms() throws {
        let defaults = try parse("{}")
        #expect(defaults.log.commitInterval == .milliseconds(5))
        #expect(defaults.backend.commitInterval == .milliseconds(5))
        let set = try parse("log: { commitInterval: 0ms }\nbackend: { commitInterval: 10ms }")
        #expect(set.log.commitInterval == .zero)
        #expect(set.backend.commitInterval == .milliseconds(10))
        #expect(try parse(#"log: { commitInterval: 100ms }"#).log.commitInterval == .milliseconds(100))
        for yaml in [#"log: { commitInterval: 101ms }"#, #"backend: { commitInterval: 1s }"#, #"log: { commitInterval: soon }"#] {
            let refused = error(yaml)
            #expect(refused?.key.hasSuffix("commitInterval") == true, "\(yaml): \(refused.map { "\($0)" } ?? "accepted")")
        }
    }

    @Test func yamlErrorsNameTheLineAndNeverEchoTheFile() {
        let yaml = """
            backend: { apiKey: "sk_live_do_not_print_me" }
            ingest: { listen: "127.0.0.1:8080" }
            ingest: { listen: "127.0.0.1:8081" }
            """
        let duplicate = error(yaml)
        #expect(duplicate?.message.contains("ingest") == true)
        #expect(duplicate?.message.contains("line") == true, "\(duplicate?.message ?? "")")
        #expect(duplicate?.description.contains("sk_live_do_not_print_me") == false)
        let broken = error("backend: { apiKey: \"sk_live_do_not_print_me\"\ningest: [")
        #expect(broken?.message.contains("line") == true)
        #expect(broken?.description.contains("sk_live_do_not_print_me") == false)
    }

    @Test func everyMissingEnvironmentVariableIsReportedAtOnceInFileOrder() throws {
        let yaml = """
            # ${NOT_THIS_ONE} is in a comment
            backend: { apiKey: "${BACKEND_KEY}" }
            apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["${STRIPE_SECRET}", "${SET_ONE}"] } }]  # ${NOR_THIS}
            endpoints: [{ id: e, app: a, url: "https://x.test", secrets: ["${HOOK_SECRET}", "${BACKEND_KEY}"] }]
            """
        let missing = error(yaml, environment: ["SET_ONE": "x"])
        // Every one, in file order, each with its line (and its key where the parse reached it).
        let message = try #require(missing?.message)
        #expect(message.hasPrefix("environment variables not set: BACKEND_KEY ("), "\(message)")
        #expect(message.contains("line 2); STRIPE_SECRET (apps[0].stripe.signingSecrets[0], line 3); HOOK_SECRET ("), "\(message)")
        #expect(message.contains("line 4); BACKEND_KEY ("), "\(message)")
        #expect(!message.contains("NOT_THIS_ONE") && !message.contains("NOR_THIS") && !message.contains("SET_ONE"))
        // The file is named when it was loaded from one.
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("relay-env-\(UUID().uuidString).yaml")
        try Data(yaml.utf8).write(to: file)
        #expect(throws: ConfigurationError.self) { try RelayConfiguration.load(path: file.path, environment: [:]) }
        do {
            _ = try RelayConfiguration.load(path: file.path, environment: [:])
        } catch {
            #expect(error.message.hasSuffix("(in \(file.path))"))
        }
    }

    @Test func unknownKeysAreRejectedByName() {
        #expect(error("kafka: { bootstrapServer: x }")?.key == "kafka.bootstrapServer")
        #expect(error("ingset: {}")?.key == "ingset")
        // /metrics on its own port: the same address as the ingest's or the backend's is refused at once.
        #expect(error(#"ingest: { listen: "0.0.0.0:8080" }\#nmetrics: { listen: "127.0.0.1:8080" }"#)?.key == "metrics.listen")
        #expect(error(#"metrics: { listen: "127.0.0.1:8081" }"#)?.key == "metrics.listen")
        #expect(error(#"metrics: { listen: "127.0.0.1:9090" }"#) == nil)
        #expect(error(#"ingest: { idleTimeout: 0s }"#)?.key == "ingest.idleTimeout")
        #expect(error(#"ingest: { maxConnections: 0 }"#)?.key == "ingest.maxConnections")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x], tolerence: 5s } }]")?.key == "apps[0].stripe.tolerence")
    }

    @Test func stripeAPIIsOptionalAndItsKeyComesFromTheEnvironment() throws {
        let app = "apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x]"
        #expect(try parse(app + " } }]").app("a")?.stripe?.api == nil)
        let configured = try parse(app + ", api: { secretKey: \"${STRIPE_API_KEY}\" } } }]", environment: ["STRIPE_API_KEY": "rk_live_1"])
        #expect(configured.app("a")?.stripe?.api?.secretKey == "rk_live_1")
        #expect(configured.app("a")?.stripe?.api?.baseUrl == "https://api.stripe.com")
        #expect(error(app + ", api: { baseUrl: \"https://api.stripe.com\" } } }]")?.key == "apps[0].stripe.api.secretKey")
        #expect(error(app + ", api: { secretKey: k, baseUrl: \"ftp://x\" } } }]")?.key == "apps[0].stripe.api.baseUrl")
        #expect(error(app + ", api: { secretKey: k, version: x } } }]")?.key == "apps[0].stripe.api.version")
    }

    @Test func badValuesNameTheirKey() {
        #expect(error("ingest: { maxBodyBytes: lots }")?.key == "ingest.maxBodyBytes")
        #expect(error("ingest: { listen: \"8080\" }")?.key == "ingest.listen")
        #expect(error("delivery: { timeout: 15 }")?.key == "delivery.timeout")
        #expect(error("delivery: { retrySchedule: [5s, soon] }")?.key == "delivery.retrySchedule[1]")
        #expect(error("apps: [{ key: a, projectId: 1 }]")?.key == "apps[0].applicationId")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, apple: { bundleId: b, environments: [Prod] } }]")?.key == "apps[0].apple.environments[0]")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, apple: { bundleId: b, environments: [Production], rootCertificates: [certs/AppleRootCA-G3.der] } }]")?.key == "apps[0].apple.appAppleId")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, apple: { bundleId: b, appAppleId: 1, environments: [Production], rootCertificates: [nope.der] } }]")?.key == "apps[0].apple.rootCertificates[0]")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1 }, { key: a, projectId: 1, applicationId: 2 }]")?.key == "apps[1].key")
        #expect(error("endpoints: [{ id: e, app: missing, url: \"https://x.test\", secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw] }]")?.key == "endpoints[0].app")
        #expect(error("kafka: [1, 2]")?.key == "kafka")
        #expect(error("kafka: {")?.key == "")
    }

    @Test func theTransferPolicyIsReadAndDefaultsToTransfer() throws {
        let configuration = try parse(
            """
            apps:
              - { key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x] } }
              - { key: b, projectId: 1, applicationId: 2, transferPolicy: keep, stripe: { signingSecrets: [y] } }
            """)
        #expect(configuration.apps.map(\.transferPolicy) == [.transfer, .keep])
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, transferPolicy: move }]")?.key == "apps[0].transferPolicy")
    }

    @Test func webCheckoutIsReadAndChecked() throws {
        let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
        func app(_ web: String, api: Bool = true) -> String {
            """
            apps:
              - key: a
                projectId: 1
                applicationId: 1
                stripe: { signingSecrets: [x]\(api ? ", api: { secretKey: sk_test_x }" : "") }
                web: \(web)
            """
        }
        let good = #"{ successUrl: "https://p.example.com/ok", redemptionUrl: "app://redeem?code={code}", contextKeys: [{ id: k1, key: "\#(key)" }, { id: k0, key: "\#(key)" }] }"#
        let web = try #require(try parse(app(good)).apps[0].web)
        #expect(web.contextKeys.map(\.id) == ["k1", "k0"])
        #expect(web.contextKeys[0].key.count == 32)
        #expect(web.codeTTL == .seconds(30 * 86_400))
        #expect(web.stripePublishableKey == nil)
        // Without Stripe's API, without {code}, with a key that is not 32 bytes, without keys: named errors.
        #expect(error(app(good, api: false))?.key == "apps[0].web")
        #expect(error(app(#"{ successUrl: "https://p.example.com/ok", redemptionUrl: "app://redeem", contextKeys: [{ id: k1, key: "\#(key)" }] }"#))?.key == "apps[0].web.redemptionUrl")
        #expect(error(app(#"{ successUrl: "https://p.example.com/ok", redemptionUrl: "app://r?c={code}", contextKeys: [{ id: k1, key: "c2hvcnQ=" }] }"#))?.key == "apps[0].web.contextKeys[0].key")
        #expect(error(app(#"{ successUrl: "https://p.example.com/ok", redemptionUrl: "app://r?c={code}", contextKeys: [] }"#))?.key == "apps[0].web.contextKeys")
        #expect(error(app(#"{ redemptionUrl: "app://r?c={code}", contextKeys: [{ id: k1, key: "\#(key)" }] }"#))?.key == "apps[0].web.successUrl")
    }

    @Test func theIngestsClientLimitsProxiesAndSourcesAreRead() throws {
        let defaults = try parse("ingest: { maxConnections: 512 }")
        #expect(defaults.ingest.trustedProxies.isEmpty)
        #expect(defaults.ingest.allowedSources.isEmpty)
        #expect(defaults.ingest.clientLimit.requestsPerSecond == 100)
        #expect(defaults.ingest.clientLimit.burst == 1_000)
        #expect(defaults.ingest.clientLimit.unverifiedBytes == 16 * 1024 * 1024)
        let configuration = try parse(
            """
            ingest:
              trustedProxies: ["10.0.0.0/8", "::1", "2001:db8::/32"]
              clientLimit: { requestsPerSecond: 0, burst: 5, unverifiedBytes: 0 }
              allowedSources: { apple: ["17.0.0.0/8"] }
            """)
        #expect(configuration.ingest.trustedProxies.map(\.description) == ["10.0.0.0/8", "::1/128", "2001:db8::/32"])
        #expect(configuration.ingest.clientLimit.requestsPerSecond == 0)
        #expect(configuration.ingest.clientLimit.burst == 5)
        #expect(configuration.ingest.clientLimit.unverifiedBytes == 0)
        #expect(configuration.ingest.allowedSources.keys.sorted { $0.rawValue < $1.rawValue } == [.apple])
        #expect(configuration.ingest.allowedSources[.apple]?.first?.contains(IPAddress("17.250.1.2")!) == true)
        #expect(error("ingest: { trustedProxies: [\"10.0.0.0/33\"] }")?.key == "ingest.trustedProxies[0]")
        #expect(error("ingest: { trustedProxies: [\"proxy.internal\"] }")?.key == "ingest.trustedProxies[0]")
        #expect(error("ingest: { allowedSources: { amazon: [\"1.2.3.4\"] } }")?.key == "ingest.allowedSources.amazon")
        #expect(error("ingest: { allowedSources: { apple: [] } }")?.key == "ingest.allowedSources.apple")
        #expect(error("ingest: { clientLimit: { unverifiedBytes: 1000 } }")?.key == "ingest.clientLimit.unverifiedBytes")
        #expect(error("ingest: { clientLimit: { requestsPerSecond: -1 } }")?.key == "ingest.clientLimit.requestsPerSecond")
    }

    @Test func theThreeKindsOfKeyAreRead() throws {
        let configuration = try parse(
            """
            backend:
              apiKey: "sk_current"
              apiKeys: ["sk_next"]
              readKeys: [{ key: "rk_analytics", apps: [ios, web] }]
              publicRateLimit: { requestsPerSecond: 2.5, burst: 10, clientAddressHeader: X-Forwarded-For, trustedProxies: ["10.0.0.0/8"] }
            apps:
              - { key: ios, projectId: 1, applicationId: 1, publicApiKeys: ["pk_ios_a", "pk_ios_b"], stripe: { signingSecrets: [x] } }
              - { key: web, projectId: 1, applicationId: 2, stripe: { signingSecrets: [y] } }
            """)
        #expect(configuration.backend.secretKeys == ["sk_current", "sk_next"])
        #expect(configuration.backend.clientKey == "sk_current")
        #expect(configuration.backend.readKeys.map(\.key) == ["rk_analytics"])
        #expect(configuration.backend.readKeys.first?.apps == ["ios", "web"])
        #expect(configuration.app("ios")?.publicApiKeys == ["pk_ios_a", "pk_ios_b"])
        #expect(configuration.app("web")?.publicApiKeys == [])
        #expect(configuration.backend.publicRateLimit.requestsPerSecond == 2.5)
        #expect(configuration.backend.publicRateLimit.burst == 10)
        #expect(configuration.backend.publicRateLimit.clientAddressHeader == "X-Forwarded-For")
        #expect(configuration.backend.publicRateLimit.trustedProxies.map(\.description) == ["10.0.0.0/8"])
        // Defaults: generous for a real app, and the TCP peer as the client.
        let defaults = try parse("backend: { apiKeys: [\"sk_only\"] }")
        #expect(defaults.backend.clientKey == "sk_only")
        #expect(defaults.backend.publicRateLimit.requestsPerSecond == 20)
        #expect(defaults.backend.publicRateLimit.burst == 200)
        #expect(defaults.backend.publicRateLimit.clientAddressHeader == nil)
    }

    /// One key string in two places would give its holder both scopes: refused, naming both places and never the key.
    @Test func aKeyConfiguredTwiceIsAnErrorNamingBothPlacesButNotTheKey() {
        let app = { (key: String, id: Int, keys: String) in "{ key: \(key), projectId: 1, applicationId: \(id), publicApiKeys: [\(keys)], stripe: { signingSecrets: [x] } }" }
        let cases: [(yaml: String, place: String, other: String)] = [
            ("backend: { apiKey: \"dup_key_1\", apiKeys: [\"dup_key_1\"] }", "backend.apiKeys[0]", "backend.apiKey"),
            ("backend: { apiKey: \"dup_key_1\", readKeys: [{ key: \"dup_key_1\", apps: [a] }] }\napps: [\(app("a", 1, "p"))]", "backend.readKeys[0].key", "backend.apiKey"),
            // A control: one public key in one app is fine.
            ("backend: { apiKey: \"k\" }\napps: [\(app("a", 1, "\"dup_key_1\""))]", "", ""),
            ("backend: { apiKey: \"dup_key_1\" }\napps: [\(app("a", 1, "\"dup_key_1\""))]", "apps[0].publicApiKeys[0]", "backend.apiKey"),
            ("backend: { apiKey: \"k\", readKeys: [{ key: \"dup_key_1\", apps: [a] }] }\napps: [\(app("a", 1, "\"dup_key_1\""))]",
             "apps[0].publicApiKeys[0]", "backend.readKeys[0].key"),
            ("backend: { apiKey: \"k\" }\napps: [\(app("a", 1, "p1")), \(app("b", 2, "\"dup_key_1\", p2, \"dup_key_1\""))]", "apps[1].publicApiKeys[2]", "apps[1].publicApiKeys[0]"),
            ("backend: { apiKey: \"k\" }\napps: [\(app("a", 1, "\"dup_key_1\"")), \(app("b", 2, "\"dup_key_1\""))]", "apps[1].publicApiKeys[0]", "apps[0].publicApiKeys[0]"),
        ]
        for (yaml, place, other) in cases {
            let failure = error(yaml)
            if place.isEmpty {
                #expect(failure == nil, "one public key in one app is fine: \(failure?.description ?? "")")
                continue
            }
            #expect(failure?.key == place, "\(yaml)")
            #expect(failure?.message.contains(other) == true, "\(failure?.description ?? "nil")")
            #expect(failure?.description.contains("dup_key_1") == false)
        }
    }

    @Test func readKeysNameConfiguredAppsAndAppsHaveTheirOwnApplicationId() {
        let twoApps = "apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x] } }, { key: b, projectId: 1, applicationId: 1, stripe: { signingSecrets: [y] } }]"
        let shared = error(twoApps)
        #expect(shared?.key == "apps[1].applicationId")
        #expect(shared?.message.contains("apps[0]") == true)
        let app = "apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x] } }]"
        #expect(error("backend: { apiKey: k, readKeys: [{ key: r, apps: [nope] }] }\n" + app)?.key == "backend.readKeys[0].apps[0]")
        #expect(error("backend: { apiKey: k, readKeys: [{ key: r, apps: [] }] }\n" + app)?.key == "backend.readKeys[0].apps")
        #expect(error("backend: { apiKey: k, readKeys: [{ key: r }] }\n" + app)?.key == "backend.readKeys[0].apps")
        #expect(error("backend: { apiKey: k, apiKeys: [\"\"] }")?.key == "backend.apiKeys[0]")
        #expect(error("backend: { publicRateLimit: { requestsPerSecond: -1 } }")?.key == "backend.publicRateLimit.requestsPerSecond")
        // A rate too small to state a wait in seconds.
        #expect(error("backend: { publicRateLimit: { requestsPerSecond: 1e-20 } }")?.key == "backend.publicRateLimit.requestsPerSecond")
        #expect(error("backend: { apiKey: \"\(String(repeating: "k", count: 257))\" }")?.key == "backend.apiKey")
        #expect(error("backend: { publicRateLimit: { clientAddressHeader: \"X Forwarded\" } }")?.key == "backend.publicRateLimit.clientAddressHeader")
        #expect(error("apps: [{ key: a, projectId: 1, applicationId: 1, publicApiKeys: p, stripe: { signingSecrets: [x] } }]")?.key == "apps[0].publicApiKeys")
    }

    /// An app that takes Stripe webhooks without Stripe's API loses what a refund is for: said at startup.
    @Test func stripeWithoutItsAPIIsAWarningNamingTheKey() throws {
        let without = try parse(
            "apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [whsec_not_to_print] } }, { key: b, projectId: 1, applicationId: 2, paddle: { secretKeys: [p] } }]")
        #expect(without.warnings.map(\.key) == ["apps[0].stripe.api"])
        #expect(without.warnings.first?.message.contains("refund") == true)
        #expect(without.warnings.first?.description.contains("whsec_not_to_print") == false)
        let with = try parse("apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [x], api: { secretKey: rk_test } } }]")
        #expect(with.warnings.isEmpty)
    }

    @Test func durationsAcceptTheDocumentedUnits() throws {
        let configuration = try parse("delivery: { retrySchedule: [250ms, 15s, 5m, 2h] }")
        #expect(configuration.delivery.retrySchedule == [.milliseconds(250), .seconds(15), .seconds(300), .seconds(7200)])
    }

    @Test func environmentVariablesAreSubstitutedAndUnsetOnesAreErrors() throws {
        let yaml = "apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [\"${STRIPE_SECRET}\", \"pre-${OTHER}-post\"] } }]"
        let configuration = try parse(yaml, environment: ["STRIPE_SECRET": "whsec_abc", "OTHER": "x"])
        #expect(configuration.apps[0].stripe?.signingSecrets == ["whsec_abc", "pre-x-post"])

        let failure = error(yaml, environment: ["OTHER": "x"])
        #expect(failure?.key == "apps[0].stripe.signingSecrets[0]")
        #expect(failure?.message.contains("STRIPE_SECRET") == true)
    }

    @Test func errorsNeverEchoSecretValues() {
        let failure = error("apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [\"${S}\"], tolerance: \"${S}\" } }]", environment: ["S": "whsec_supersecret"])
        #expect(failure?.key == "apps[0].stripe.tolerance")
        #expect(failure.map { !"\($0)".contains("supersecret") } == true)
    }

    @Test func pathsResolveAgainstTheConfigurationFolder() throws {
        let configuration = try parse("backend: { database: data/backend.sqlite }")
        #expect(configuration.backend.database == Self.repositoryRoot.appendingPathComponent("config/data/backend.sqlite").path)
        let absolute = try parse("backend: { database: /var/lib/relay.sqlite }")
        #expect(absolute.backend.database == "/var/lib/relay.sqlite")
    }

    @Test func theAppStoreServerAPIConsumptionAnswersAndGrandfatheringRulesAreChecked() throws {
        // The private key must exist: a committed PEM stands in for a .p8 here (only its path is checked).
        let base = """
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                apple:
                  bundleId: com.example.app
                  appAppleId: 1234
                  environments: [Sandbox, Production]
                  rootCertificates: [certs/AppleRootCA-G3.der]
            """
        let key = "serverApi: { keyId: ABC123DEFG, issuerId: 57246542-96fe-1a63-e053-0824d011072a, privateKey: dev/apple-test-root.pem }"
        let full = try parse(base + """

                  \(key)
                  consumption: { customerConsented: true, refundPreference: DECLINE }
                  grandfathering:
                    - { entitlements: [pro], originalAppVersionBelow: "2.0" }
                    - { entitlements: [pro, extras], purchasedBefore: 2025-01-01 }
            """)
        let apple = try #require(full.apps.first?.apple)
        #expect(apple.serverApi?.keyId == "ABC123DEFG" && apple.serverApi?.environment == "Production" && apple.serverApi?.privateKey.hasSuffix("config/dev/apple-test-root.pem") == true)
        #expect(apple.consumption?.refundPreference == "DECLINE" && apple.consumption?.sampleContentProvided == false)
        #expect(apple.grandfathering.map(\.entitlements) == [["pro"], ["pro", "extras"]])
        #expect(apple.grandfathering.last?.purchasedBefore == 1_735_689_600_000)
        #expect(try parse(base).apps.first?.apple?.consumption == nil)
        // The nested JWSs' own signatures: verified unless turned off.
        #expect(try parse(base).apps.first?.apple?.verifyNestedSignatures == true)
        #expect(try parse(base + "\n      verifyNestedSignatures: false").apps.first?.apple?.verifyNestedSignatures == false)

        for (extra, key) in [
            ("verifyNestedSignatures: sometimes", "apps[0].apple.verifyNestedSignatures"),
            ("serverApi: { keyId: A, issuerId: B, privateKey: missing.p8 }", "apps[0].apple.serverApi.privateKey"),
            ("serverApi: { keyId: A, issuerId: B, privateKey: dev/apple-test-root.pem, environment: Xcode }", "apps[0].apple.serverApi.environment"),
            ("consumption: { customerConsented: true }", "apps[0].apple.consumption"),
            ("\(key)\n      consumption: { customerConsented: false }", "apps[0].apple.consumption.customerConsented"),
            ("\(key)\n      consumption: { customerConsented: true, refundPreference: MAYBE }", "apps[0].apple.consumption.refundPreference"),
            ("grandfathering: [{ entitlements: [pro] }]", "apps[0].apple.grandfathering[0]"),
            ("grandfathering: [{ entitlements: [pro], originalAppVersionBelow: two }]", "apps[0].apple.grandfathering[0].originalAppVersionBelow"),
            ("grandfathering: [{ entitlements: [], purchasedBefore: 2025-01-01 }]", "apps[0].apple.grandfathering[0].entitlements"),
        ] {
            #expect(error(base + "\n      " + extra)?.key == key, "\(extra)")
        }
        // A key for an environment the app does not take: everything it would read is rejected.
        let sandboxOnly = base.replacingOccurrences(of: "[Sandbox, Production]", with: "[Sandbox]")
        #expect(error(sandboxOnly + "\n      " + key)?.key == "apps[0].apple.serverApi.environment")
        #expect(error(sandboxOnly + "\n      " + key.replacingOccurrences(of: " }", with: ", environment: Sandbox }")) == nil)
    }

}

/// The deployment files ship what the process needs (these broke silently before: a user without its
/// data directory, the exchange rates missing from the image, the descriptor limit).
@Suite struct DeploymentFilesTests {
    static let root = ConfigurationTests.repositoryRoot

    func read(_ path: String) throws -> String {
        try String(contentsOfFile: Self.root.appendingPathComponent(path).path, encoding: .utf8)
    }

    @Test func theImageHasItsUserDataDirectoryRatesAndPorts() throws {
        let dockerfile = try read("deploy/Dockerfile")
        #expect(dockerfile.contains("--home-dir /var/lib/revenue-relay --create-home revenue-relay"))
        // example.yaml's money.exchangeRates is relative to /etc/revenue-relay/relay.yaml.
        #expect(try read("config/example.yaml").contains("exchangeRates: exchange-rates.json"))
        #expect(dockerfile.contains("COPY config/exchange-rates.json /etc/revenue-relay/exchange-rates.json"))
        #expect(dockerfile.contains("EXPOSE 8080 8081"))
        let ignored = try read(".dockerignore").split(separator: "\n")
        #expect(ignored.contains(".build/") && ignored.contains(".git/"))
    }

    @Test func theUnitsUserIsCreatedAndItMayOpenEnoughDescriptors() throws {
        let unit = try read("deploy/systemd/revenue-relay.service")
        let user = try #require(unit.split(separator: "\n").first { $0.hasPrefix("User=") }?.dropFirst("User=".count))
        let sysusers = try read("deploy/systemd/revenue-relay.sysusers")
        #expect(sysusers.split(separator: "\n").contains { $0.hasPrefix("u \(user) ") })
        let limit = try #require(unit.split(separator: "\n").first { $0.hasPrefix("LimitNOFILE=") }.flatMap { Int($0.dropFirst("LimitNOFILE=".count)) })
        #expect(limit >= 4096)
    }
}
