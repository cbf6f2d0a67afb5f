// swift-tools-version:6.2
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "revenue-relay",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "revenue-relay", targets: ["revenue-relay"]),
        .executable(name: "revenue-relay-bench", targets: ["revenue-relay-bench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.1.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.1.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.0", traits: []),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.0.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.20.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
    ],
    targets: [
        // C libraries from Debian, found with pkg-config.
        .systemLibrary(name: "CRdKafka", pkgConfig: "rdkafka", providers: [.apt(["librdkafka-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),

        // Pure-Swift core: the pipeline's vocabulary and the record-log interface. Imports no C.
        .target(
            name: "RelayCore",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "DequeModule", package: "swift-collections"),
            ],
            swiftSettings: swiftSettings
        ),
        // The YAML configuration of docs/configuration.md.
        .target(
            name: "RelayConfig",
            dependencies: ["RelayCore", .product(name: "Yams", package: "Yams")],
            swiftSettings: swiftSettings
        ),
        // Kafka client over librdkafka: producer, consumer group, embedded mock broker.
        .target(
            name: "RelayKafka",
            dependencies: [
                "CRdKafka", "RelayCore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // Outgoing HTTP over libcurl.
        .target(
            name: "RelayHTTPClient",
            dependencies: ["CCurl", "RelayCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        // The OpenSSL wrappers every module signs and verifies with: certificates and trust stores, EC and
        // RSA keys, HMAC-SHA256 and digests. Each C handle has one owner type that frees it.
        .target(
            name: "RelayCrypto",
            dependencies: ["COpenSSL"],
            swiftSettings: swiftSettings
        ),
        // Verification of every store's notifications, all cryptography through RelayCrypto (OpenSSL).
        .target(
            name: "RelayVerification",
            dependencies: [
                "RelayCrypto", "RelayCore", "RelayConfig", "RelayHTTPClient",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The backend API's client (docs/contracts.md, Backend API), and the worker's state store over it.
        .target(
            name: "RelayBackend",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayHTTPClient",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // How the relay's SQLite databases are opened (durable commits) and checkpointed (beside the commits).
        .target(
            name: "RelaySQLite",
            dependencies: [
                "RelayCore",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The local backend: the four routes of docs/contracts.md, Backend API over SQLite (GRDB), for dev and small deployments.
        .target(
            name: "RelayLocalBackend",
            dependencies: [
                "RelayCore", "RelayConfig", "RelaySQLite", "RelayCrypto",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // Inbound HTTP: the store notification routes, health and metrics.
        .target(
            name: "RelayIngest",
            dependencies: [
                "RelayCore", "RelayConfig",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // Google Play Developer API over libcurl: service-account OAuth (RS256 JWT bearer grant signed with
        // OpenSSL), subscriptionsv2 and one-time product purchases.
        .target(
            name: "RelayGooglePlay",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayHTTPClient", "RelayCrypto",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The App Store Server API over libcurl: ES256 tokens signed with an App Store Connect key (OpenSSL),
        // transaction and notification history, subscription statuses, consumption answers.
        .target(
            name: "RelayAppStoreAPI",
            dependencies: [
                "RelayCore", "RelayHTTPClient", "RelayCrypto", "RelayConfig",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The embedded durable record log (SQLite): one machine, no broker.
        .target(
            name: "RelayEmbeddedLog",
            dependencies: [
                "RelayCore", "RelayConfig", "RelaySQLite",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // The Stripe API reads behind a refund (its charge's invoice and subscription).
        .target(
            name: "RelayStripe",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayHTTPClient",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The Paddle API reads behind a purchase an app hands over (a transaction, its subscription).
        .target(
            name: "RelayPaddle",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayHTTPClient",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Store notifications → standardized events (docs/contracts.md, the standardized event) and subscription state.
        .target(
            name: "RelayNormalization",
            dependencies: [
                "RelayCore", "RelayConfig",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // Webhook delivery: Standard Webhooks signing, sending, retries, dead letters, replay.
        .target(
            name: "RelayDelivery",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayCrypto", "RelayHTTPClient",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // The worker: consumes raw notifications and runs the stages.
        .target(
            name: "RelayWorker",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayVerification", "RelayNormalization",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // Wires the roles into one ServiceGroup: `run` and `dev`.
        .target(
            name: "RelayHistory",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayAppStoreAPI", "RelayBackend", "RelayHTTPClient", "RelayVerification", "RelayStripe", "RelayGooglePlay", "RelayPaddle",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "RelayApp",
            dependencies: [
                "RelayCore", "RelayConfig", "RelayKafka", "RelayIngest", "RelayWorker", "RelayVerification", "RelayHTTPClient",
                "RelayBackend", "RelayLocalBackend", "RelayNormalization", "RelayGooglePlay", "RelayStripe", "RelayPaddle", "RelayDelivery", "RelayEmbeddedLog",
                "RelayAppStoreAPI",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "revenue-relay",
            dependencies: [
                "RelayApp", "RelayConfig", "RelayCore", "RelayVerification", "RelayNormalization", "RelayDelivery", "RelayWorker", "RelayHTTPClient",
                "RelayHistory", "RelayBackend",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Benchmarks whose results the README reports: `swift run -c release revenue-relay-bench ...`.
        .executableTarget(
            name: "revenue-relay-bench",
            dependencies: [
                "RelayCrypto",
                "RelayVerification", "RelayConfig", "RelayCore", "RelayDelivery", "RelayKafka", "RelayHTTPClient", "RelayEmbeddedLog", "RelayIngest",
                "RelayApp", "RelayLocalBackend", "RelaySQLite",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),

        .target(
            name: "RelayTestSupport",
            dependencies: [
                "RelayCrypto", "RelayKafka", "RelayHTTPClient", "RelayCore", "RelayConfig", "RelayVerification", "RelayAppStoreAPI",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/RelayTestSupport",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayEmbeddedLogTests",
            dependencies: [
                "RelayCrypto", "RelayEmbeddedLog", "RelayKafka", "RelayCore", "RelayConfig", "RelayTestSupport", "RelaySQLite",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayKafkaTests",
            dependencies: ["RelayCrypto", "RelayKafka", "RelayTestSupport"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayVerificationTests",
            dependencies: [
                "RelayCrypto", "RelayVerification", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayHTTPClient",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayHTTPClientTests",
            dependencies: ["RelayCrypto", "RelayHTTPClient", "RelayTestSupport"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayBackendTests",
            dependencies: [
                "RelayCrypto", "RelayBackend", "RelayLocalBackend", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayHTTPClient",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayGooglePlayTests",
            dependencies: [
                "RelayCrypto", "RelayGooglePlay", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayHTTPClient", "RelayVerification",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayAppStoreAPITests",
            dependencies: [
                "RelayCrypto", "RelayAppStoreAPI", "RelayTestSupport", "RelayCore", "RelayHTTPClient",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayNormalizationTests",
            dependencies: [
                "RelayCrypto", "RelayNormalization", "RelayGooglePlay", "RelayStripe", "RelayBackend", "RelayLocalBackend", "RelayTestSupport", "RelayConfig",
                "RelayCore", "RelayHTTPClient", "RelayVerification",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["Scenarios"],  // data files, read from the source tree by ScenarioTests
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayDeliveryTests",
            dependencies: [
                "RelayCrypto", "RelayDelivery", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayKafka", "RelayHTTPClient",
                "RelayVerification", "RelayEmbeddedLog",
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayConfigTests",
            dependencies: ["RelayCrypto", "RelayConfig", "RelayCore"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayIngestTests",
            dependencies: [
                "RelayIngest", "RelayEmbeddedLog", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayHTTPClient",
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayLocalBackendTests",
            dependencies: [
                "RelayLocalBackend", "RelayTestSupport", "RelayConfig", "RelayCore", "RelayHTTPClient",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayWorkerTests",
            dependencies: [
                "RelayWorker", "RelayNormalization", "RelayConfig", "RelayCore", "RelayEmbeddedLog", "RelayVerification", "RelayBackend",
                "RelayTestSupport",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayCryptoTests",
            dependencies: ["RelayCrypto"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RecordLogTests",
            dependencies: ["RelayCore", "RelayKafka", "RelayEmbeddedLog", "RelayTestSupport", "RelayCrypto"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayCoreTests",
            dependencies: ["RelayCrypto", "RelayCore", "RelayTestSupport"],
            swiftSettings: swiftSettings
        ),
        // The benchmark tool's own logic: what `ab` reads of each e2e run and how it reports the pairs.
        .testTarget(
            name: "RelayBenchTests",
            dependencies: ["revenue-relay-bench"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RelayIntegrationTests",
            dependencies: [
                "RelayCrypto", "RelayApp", "RelayTestSupport", "RelayHTTPClient", "RelayKafka", "RelayEmbeddedLog", "RelayConfig", "RelayCore", "RelayWorker", "RelayBackend", "RelayLocalBackend", "RelayAppStoreAPI", "RelayHistory", "RelayStripe",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
