import CoreMetrics
import Foundation
import GRDB
import Logging
import RelayBackend
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import ServiceLifecycle
import Testing
import Yams

/// A local backend on 127.0.0.1 (port 0) over a SQLite file, for one test.
final class TestBackend: Sendable {
    let configuration: RelayConfiguration
    let database: String
    let url: String
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    static func configuration(database: String) throws -> RelayConfiguration {
        try RelayConfiguration.parse(
            yaml: """
                backend: { url: "http://127.0.0.1:1", apiKey: "test-key", database: "\(database)", listen: "127.0.0.1:0", entitlementsTTL: 60s }
                apps:
                  - key: demo
                    projectId: 1
                    applicationId: 7
                    stripe: { signingSecrets: ["whsec_x"] }
                    products:
                      - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
                      - { productId: com.example.plus, store: APP_STORE, entitlements: [plus, pro] }
                """,
            baseDirectory: "/", environment: [:])
    }

    init(database: String? = nil, clock: (@Sendable () -> Int64)? = nil) async throws {
        let path = database ?? FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        self.database = path
        configuration = try Self.configuration(database: path)
        let backend = try LocalBackend(configuration: configuration, database: try SubscriptionDatabase(path: path), clock: clock)
        let ports = AsyncStream.makeStream(of: Int.self)
        let application = backend.application(logger: testLogger()) { port in ports.continuation.yield(port) }
        let group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: testLogger())
        self.group = group
        task = Task { try await group.run() }
        var iterator = ports.stream.makeAsyncIterator()
        url = "http://127.0.0.1:\(await iterator.next() ?? 0)"
    }

    func client(apiKey: String? = "test-key") -> BackendClient {
        var backend = configuration.backend
        backend.url = url
        backend.apiKey = apiKey
        return BackendClient(
            configuration: backend, retry: .init(retries: 2, initialDelay: .milliseconds(10)), logger: testLogger(), metrics: NOOPMetricsHandler.instance)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}


@Suite struct BackendClientTests {
    @Test func roundTripsStateWithVersions() async throws {
        let backend = try await TestBackend()
        let client = backend.client()
        #expect(try await client.subscription(store: .apple, originalTransactionId: "1000") == nil)
        guard case .written(let first) = try await client.write(testSubscriptionState(), ifMatch: 0) else { Issue.record("not written"); return }
        #expect(first.version == 1)
        let read = try await client.subscription(store: .apple, originalTransactionId: "1000")
        #expect(read == first)
        // An id with characters that would change the path stays one segment.
        var odd = testSubscriptionState("a/b c?d")
        odd.originalAppUserId = nil
        odd.appUserIds = []
        #expect(try await client.write(odd, ifMatch: 0) == .written({ var s = odd; s.version = 1; return s }()))
        #expect(try await client.subscription(store: .apple, originalTransactionId: "a/b c?d")?.originalTransactionId == "a/b c?d")
        // Non-ASCII letters are encoded too, and `..` cannot climb the path.
        for id in ["tökén", ".."] {
            var other = odd
            other.originalTransactionId = id
            #expect(try await client.write(other, ifMatch: 0) != .versionMismatch)
            #expect(try await client.subscription(store: .apple, originalTransactionId: id)?.originalTransactionId == id)
        }
        await backend.stop()
    }

    @Test func aLateWriterGets412AndUpdateReappliesOnTheNewState() async throws {
        let backend = try await TestBackend()
        let client = backend.client()
        _ = try await client.write(testSubscriptionState(), ifMatch: 0)
        // Two writers read version 1; the first wins, the second is told to re-read.
        var a = testSubscriptionState(at: 2_000)
        a.autoRenew = false
        #expect(try await client.write(a, ifMatch: 1) != .versionMismatch)
        #expect(try await client.write(testSubscriptionState(at: 3_000), ifMatch: 1) == .versionMismatch)
        let outcome = try await client.update(store: .apple, originalTransactionId: "1000") { current in
            guard var next = current else { return nil }
            next.sourceTimestamp = 3_000
            next.appUserIds.append("user-2")
            return next
        }
        guard case .updated(let before, let after) = outcome else { Issue.record("\(outcome)"); return }
        #expect(before?.autoRenew == false)
        #expect(after.autoRenew == false, "the first writer's change survives")
        #expect(after.appUserIds == ["user-1", "user-2"])
        #expect(after.version == 3)
        await backend.stop()
    }

    @Test func manyParallelWritersLoseNoUpdate() async throws {
        let backend = try await TestBackend()
        let client = backend.client()
        _ = try await client.write(testSubscriptionState(), ifMatch: 0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<20 {
                group.addTask {
                    _ = try await client.update(store: .apple, originalTransactionId: "1000", attempts: 50) { current in
                        guard var next = current else { return nil }
                        next.appUserIds.append("writer-\(index)")
                        return next
                    }
                }
            }
            try await group.waitForAll()
        }
        let final = try #require(try await client.subscription(store: .apple, originalTransactionId: "1000"))
        #expect(Set(final.appUserIds) == Set(["user-1"] + (0..<20).map { "writer-\($0)" }))
        #expect(final.version == 21)
        await backend.stop()
    }

    @Test func writesNeverGoBackInSourceTime() async throws {
        let backend = try await TestBackend()
        let client = backend.client()
        _ = try await client.write(testSubscriptionState(status: .active, at: 5_000), ifMatch: 0)
        let outcome = try await client.update(store: .apple, originalTransactionId: "1000") { _ in testSubscriptionState(status: .expired, at: 4_000) }
        guard case .stale(let current) = outcome else { Issue.record("\(outcome)"); return }
        #expect(current.status == .active)
        // The backend refuses it too, whoever asks.
        guard case .stale = try await client.write(testSubscriptionState(status: .expired, at: 4_000), ifMatch: 1) else { Issue.record("not stale"); return }
        #expect(try await client.subscription(store: .apple, originalTransactionId: "1000")?.status == .active)
        await backend.stop()
    }

    @Test func aggregatesEveryActiveSubscriptionOfAUser() async throws {
        let now: Int64 = 2_000_000_000_000
        let backend = try await TestBackend(clock: { now })
        let client = backend.client()
        _ = try await client.write(testSubscriptionState("expired-one", product: "com.example.plus", expiresAt: now - 1), ifMatch: 0)
        _ = try await client.write(testSubscriptionState("active-one", product: "com.example.pro.monthly", expiresAt: now + 86_400_000), ifMatch: 0)
        let document = try #require(try await client.entitlements(appUserId: "user-1"))
        #expect(document["entitlements"] == [["identifier": "pro", "type": "SERVICE_LEVEL"]])
        let info = try #require(document["customerInfo"])
        #expect(info["subscriptions"]?.arrayValue?.count == 2)
        #expect(info["nonSubscriptions"] == [])
        let plus = info["entitlements"]?.arrayValue?.first { $0["identifier"] == "plus" }
        #expect(plus?["isActive"] == false)
        // An id never seen (a fresh install's device id) has no entitlements: 200 with empty lists.
        let nobody = try #require(try await client.entitlements(appUserId: "nobody"))
        #expect(nobody["entitlements"] == [])
        #expect(nobody["customerInfo"] == ["subscriptions": [], "nonSubscriptions": [], "entitlements": []])
        // A subscription without an app user id belongs to its anonymous id.
        _ = try await client.write(testSubscriptionState("anon", user: nil), ifMatch: 0)
        #expect(try await client.entitlements(appUserId: "$RelayAnonymous:apple:anon")?["entitlements"]?.arrayValue?.count == 1)
        #expect(try await client.entitlements(appUserId: "nobody", deviceId: "$RelayAnonymous:apple:anon")?["entitlements"]?.arrayValue?.count == 1)
        // The worker over a remote backend reads the active entries back as whole states (`store` is the SDK's
        // APP_STORE there): subscriptions and one-time purchases alike, but never the one it is processing.
        var lifetime = testSubscriptionState("lifetime", product: "com.example.plus", expiresAt: nil)
        lifetime.autoRenew = false
        _ = try await client.write(lifetime, ifMatch: 0)
        #expect(try await client.entitlements(appUserId: "user-1")?["customerInfo"]?["nonSubscriptions"]?.arrayValue?.count == 1)
        let store = BackendStateStore(client: client)
        let others = try await store.otherActiveSubscriptions(appUserId: "user-1", excluding: .apple, originalTransactionId: "active-one")
        #expect(others == [try #require(try await client.subscription(store: .apple, originalTransactionId: "lifetime"))])
        let besideLifetime = try await store.otherActiveSubscriptions(appUserId: "user-1", excluding: .apple, originalTransactionId: "lifetime")
        #expect(besideLifetime == [try #require(try await client.subscription(store: .apple, originalTransactionId: "active-one"))])
        await backend.stop()
    }

    @Test func persistsAcrossRestart() async throws {
        let first = try await TestBackend()
        _ = try await first.client().write(testSubscriptionState(), ifMatch: 0)
        await first.stop()
        let second = try await TestBackend(database: first.database)
        #expect(try await second.client().subscription(store: .apple, originalTransactionId: "1000")?.version == 1)
        await second.stop()
    }

    @Test func servesTheConfiguredProductsAndRefusesWithoutTheKey() async throws {
        let backend = try await TestBackend()
        let mapping = try await backend.client().productMapping(applicationId: 7)
        #expect(mapping.entitlements(store: .apple, productId: "com.example.plus") == ["plus", "pro"])
        await #expect { _ = try await backend.client().productMapping(applicationId: 99) } throws: { ($0 as? BackendError)?.kind == .notFound }
        await #expect { _ = try await backend.client(apiKey: "wrong").subscription(store: .apple, originalTransactionId: "1") } throws: {
            ($0 as? BackendError)?.kind == .unauthorized
        }
        // Bad requests get 400 with a JSON error.
        let http = HTTPClient()
        let path = "\(backend.url)/subscriptions-api/internal/v1/subscriptions/apple/1000"
        let noIfMatch = try await http.send("PUT", path, headers: [("Authorization", "Bearer test-key")], body: WireCoding.encode(testSubscriptionState()))
        #expect(noIfMatch.status == 400)
        #expect(try JSON.parse(noIfMatch.body)["error"] == "bad_request")
        let badBody = try await http.send("PUT", path, headers: [("Authorization", "Bearer test-key"), ("If-Match", "0")], body: Array(#"{"store":"apple"}"#.utf8))
        #expect(badBody.status == 400)
        let badStore = try await http.send("GET", "\(backend.url)/subscriptions-api/internal/v1/subscriptions/amazon/1", headers: [("Authorization", "Bearer test-key")])
        #expect(badStore.status == 400)
        #expect(try JSON.parse(badStore.body)["error"] == "bad_request")
        await backend.stop()
    }
}

/// Caching, staleness and retries against a scripted server.
@Suite struct BackendClientResilienceTests {
    func client(_ server: TestHTTPServer, ttl: Duration) -> BackendClient {
        var configuration = RelayConfiguration.Backend()
        configuration.url = server.baseURL
        configuration.apiKey = "k"
        configuration.entitlementsTTL = ttl
        return BackendClient(configuration: configuration, retry: .init(retries: 2, initialDelay: .milliseconds(10)), logger: testLogger(), metrics: NOOPMetricsHandler.instance)
    }

    static let mapping = #"{"products":[{"productId":"p1","store":"APP_STORE","entitlements":[{"identifier":"pro","type":"SERVICE_LEVEL"}]}]}"#

    @Test func cachesTheMappingForItsTTL() async throws {
        let server = try await TestHTTPServer { _ in TestHTTPResponse(text: Self.mapping) }
        let cached = client(server, ttl: .seconds(60))
        _ = try await cached.productMapping(applicationId: 1)
        #expect(try await cached.productMapping(applicationId: 1).entitlements(store: .apple, productId: "p1") == ["pro"])
        #expect(server.requests.count == 1)
        #expect(server.requests.first?.headers["authorization"] == "Bearer k")
        let uncached = client(server, ttl: .zero)
        _ = try await uncached.productMapping(applicationId: 1)
        _ = try await uncached.productMapping(applicationId: 1)
        #expect(server.requests.count == 3)
        await server.stop()
    }

    @Test func servesAStaleMappingWhileTheBackendIsDownButNeverInventsOne() async throws {
        let down = LockedBox(false)
        let server = try await TestHTTPServer { _ in down.value ? TestHTTPResponse(status: 503, text: "down") : TestHTTPResponse(text: Self.mapping) }
        let client = client(server, ttl: .zero)
        _ = try await client.productMapping(applicationId: 1)
        down.withLock { $0 = true }
        #expect(try await client.productMapping(applicationId: 1).products.count == 1)
        await #expect { _ = try await client.productMapping(applicationId: 2) } throws: { ($0 as? BackendError)?.kind == .unavailable }
        await server.stop()
    }

    @Test func aMissingMappingIsNotFound() async throws {
        let server = try await TestHTTPServer { _ in TestHTTPResponse(status: 404, text: #"{"error":"not_found"}"#) }
        await #expect { _ = try await client(server, ttl: .seconds(60)).productMapping(applicationId: 1) } throws: {
            ($0 as? BackendError)?.kind == .notFound
        }
        await server.stop()
    }

    @Test func aBackendWithoutTheUsersRouteServesEveryIdAsItsOwnUserButAnOutageStaysAnError() async throws {
        let down = LockedBox(false)
        // A backend written before linking: the users route is unknown to it.
        let server = try await TestHTTPServer { _ in
            down.value ? TestHTTPResponse(status: 503, text: "down") : TestHTTPResponse(status: 404, text: #"{"error":"not_found"}"#)
        }
        let store = BackendStateStore(client: client(server, ttl: .zero))
        #expect(try await store.appUser("user-1", applicationId: 1) == AppUser(appUserId: "user-1"))
        #expect(server.requests.last?.path.hasPrefix("/subscriptions-api/internal/v1/users/user-1") == true)
        down.withLock { $0 = true }
        await #expect { _ = try await store.appUser("user-1", applicationId: 1) } throws: { ($0 as? BackendError)?.kind == .unavailable }
        await server.stop()
    }

    @Test func retries503ThenSucceeds() async throws {
        let calls = LockedBox(0)
        let server = try await TestHTTPServer { _ in
            let call = calls.withLock { $0 += 1; return $0 }
            return call <= 2 ? TestHTTPResponse(status: 503, text: "busy") : TestHTTPResponse(status: 404, text: "{}")
        }
        #expect(try await client(server, ttl: .seconds(60)).subscription(store: .apple, originalTransactionId: "1") == nil)
        #expect(calls.value == 3)
        await server.stop()
    }
}

/// `docs/backend-openapi.yaml` describes exactly what the local backend serves.
@Suite struct OpenAPIDocumentTests {
    static let document = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("docs/backend-openapi.yaml")

    /// Each operation's `security` names exactly the kinds of key its route admits in the backend.
    @Test func everyOperationDeclaresTheKeysItsRouteAdmits() throws {
        let root = try #require(try Yams.load(yaml: try String(contentsOf: Self.document, encoding: .utf8)) as? [String: Any])
        let paths = try #require(root["paths"] as? [String: Any])
        let schemes = try #require(((root["components"] as? [String: Any])?["securitySchemes"] as? [String: Any])?.keys)
        #expect(Set(schemes) == ["secretKey", "readKey", "publicKey"])
        /// A path with its parameters blanked, so `{appUserIdOrDeviceId}` and `:appUserId` compare equal.
        func shape(_ path: String) -> String {
            path.split(separator: "/").map { $0.hasPrefix("{") || $0.hasPrefix(":") ? "*" : String($0) }.joined(separator: "/")
        }
        var documented: [String: Set<String>] = [:]
        for (path, item) in paths {
            for (method, operation) in (item as? [String: Any]) ?? [:] where method != "parameters" {
                let security = ((operation as? [String: Any])?["security"] as? [[String: Any]]) ?? []
                // Alternatives (any one key), never a requirement of two keys at once.
                #expect(security.allSatisfy { $0.count == 1 }, "\(method) \(path)")
                documented["\(method.uppercased()) \(shape(path))"] = Set(security.flatMap(\.keys))
            }
        }
        let expected = Dictionary(uniqueKeysWithValues: LocalBackend.routeScopes.map { route, scope in
            ("\(route.method.rawValue) \(shape(route.path))", scope == .secret ? Set(["secretKey"]) : scope == .read ? ["secretKey", "readKey"] : ["secretKey", "publicKey"])
        })
        #expect(documented == expected)
    }

    @Test func everyDocumentedOperationAnswersWithADocumentedStatus() async throws {
        let yaml = try String(contentsOf: Self.document, encoding: .utf8)
        let root = try #require(try Yams.load(yaml: yaml) as? [String: Any])
        let paths = try #require(root["paths"] as? [String: Any])
        #expect(Set(paths.keys) == [
            "/config-api/read/v1-application-id/{applicationId}/entitlements/{responseVersion}",
            "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}",
            "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/entitlements",
            "/subscriptions-api/public/v1/products",
            "/subscriptions-api/internal/v1/events",
            "/subscriptions-api/internal/v1/revenue",
            "/subscriptions-api/internal/v1/metrics",
            "/subscriptions-api/internal/v1/customers/{appUserId}",
            "/subscriptions-api/internal/v1/deliveries",
            "/subscriptions-api/internal/v1/subscriptions",
            "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/app-transaction",
            "/subscriptions-api/public/v1/users/{appUserId}/aliases",
            "/subscriptions-api/internal/v1/users/{appUserId}",
            "/subscriptions-api/public/v1/users/{appUserId}/attributes",
            "/subscriptions-api/public/v1/users/{appUserId}/purchases",
            "/subscriptions-api/internal/v1/users/{appUserId}/grants",
            "/subscriptions-api/internal/v1/users/{appUserId}/grants/{grantId}",
            "/subscriptions-api/public/v1/checkout/session", "/subscriptions-api/public/v1/checkout/status",
            "/subscriptions-api/public/v1/checkout/session/confirm", "/subscriptions-api/public/v1/checkout/session/complete",
            "/subscriptions-api/public/v1/checkout/session/poll-redemption-result", "/subscriptions-api/public/v1/redeem",
            "/subscriptions-api/internal/v1/endpoints", "/subscriptions-api/internal/v1/deliveries/{deliveryId}/resend",
            "/subscriptions-api/internal/v1/endpoints/{endpointId}/recover", "/subscriptions-api/internal/v1/endpoints/{endpointId}/enable",
        ])
        // The state schema names exactly the fields the backend stores and returns.
        let schemas = try #require((root["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let stateProperties = try #require(((schemas["SubscriptionState"] as? [String: Any])?["properties"] as? [String: Any])?.keys)
        #expect(Set(stateProperties) == Set(testSubscriptionState().json.objectValue!.keys))

        let backend = try await TestBackend()
        let http = HTTPClient()
        let auth = ("Authorization", "Bearer test-key")
        _ = try await backend.client().write(testSubscriptionState(), ifMatch: 0)
        let calls: [(method: String, template: String, url: String, headers: [(String, String)], body: [UInt8]?)] = [
            ("get", "/config-api/read/v1-application-id/{applicationId}/entitlements/{responseVersion}", "/config-api/read/v1-application-id/7/entitlements/1", [auth], nil),
            ("get", "/config-api/read/v1-application-id/{applicationId}/entitlements/{responseVersion}", "/config-api/read/v1-application-id/8/entitlements/1", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}", "/subscriptions-api/internal/v1/subscriptions/apple/1000", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}", "/subscriptions-api/internal/v1/subscriptions/apple/1000", [], nil),
            ("put", "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}", "/subscriptions-api/internal/v1/subscriptions/apple/1000", [auth, ("If-Match", "1")], WireCoding.encode(testSubscriptionState(at: 2_000))),
            ("put", "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}", "/subscriptions-api/internal/v1/subscriptions/apple/1000", [auth, ("If-Match", "1")], WireCoding.encode(testSubscriptionState(at: 3_000))),
            ("put", "/subscriptions-api/internal/v1/subscriptions/{store}/{originalTransactionId}", "/subscriptions-api/internal/v1/subscriptions/apple/1000", [auth, ("If-Match", "2")], WireCoding.encode(testSubscriptionState(at: 1))),
            ("get", "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/entitlements", "/subscriptions-api/public/v1/users/user-1/entitlements", [auth], nil),
            ("get", "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/entitlements", "/subscriptions-api/public/v1/users/nobody/entitlements", [auth], nil),
            ("get", "/subscriptions-api/public/v1/products", "/subscriptions-api/public/v1/products", [auth], nil),
            ("get", "/subscriptions-api/public/v1/products", "/subscriptions-api/public/v1/products?applicationId=99", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/events", "/subscriptions-api/internal/v1/events?limit=10", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/events", "/subscriptions-api/internal/v1/events?type=refund", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/revenue", "/subscriptions-api/internal/v1/revenue?groupBy=day", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/revenue", "/subscriptions-api/internal/v1/revenue", [], nil),
            ("get", "/subscriptions-api/internal/v1/metrics", "/subscriptions-api/internal/v1/metrics?since=2026-01-01&until=2026-01-08", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/metrics", "/subscriptions-api/internal/v1/metrics", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/metrics", "/subscriptions-api/internal/v1/metrics", [], nil),
            ("get", "/subscriptions-api/internal/v1/customers/{appUserId}", "/subscriptions-api/internal/v1/customers/user-1", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/customers/{appUserId}", "/subscriptions-api/internal/v1/customers/user-1?applicationId=99", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/deliveries", "/subscriptions-api/internal/v1/deliveries?status=dead", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/deliveries", "/subscriptions-api/internal/v1/deliveries?status=lost", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/subscriptions", "/subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=7", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/subscriptions", "/subscriptions-api/internal/v1/subscriptions?store=apple", [auth], nil),
            ("post", "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/app-transaction", "/subscriptions-api/public/v1/users/user-1/app-transaction?applicationId=7", [auth], Array(#"{"signedAppTransaction": "not.a.jws"}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/app-transaction", "/subscriptions-api/public/v1/users/user-1/app-transaction?applicationId=7", [], Array(#"{"signedAppTransaction": "a.b.c"}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/users/{appUserId}/aliases", "/subscriptions-api/public/v1/users/user-1/aliases?applicationId=7", [auth], Array(#"{"aliasIds": ["$SuperwallAlias:1"]}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/users/{appUserId}/aliases", "/subscriptions-api/public/v1/users/user-1/aliases?applicationId=7", [auth], Array(#"{"aliasIds": []}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/users/{appUserId}/aliases", "/subscriptions-api/public/v1/users/user-1/aliases?applicationId=99", [auth], Array(#"{"aliasIds": ["x"]}"#.utf8)),
            ("get", "/subscriptions-api/internal/v1/users/{appUserId}", "/subscriptions-api/internal/v1/users/$SuperwallAlias:1?applicationId=7", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/users/{appUserId}", "/subscriptions-api/internal/v1/users/user-1?applicationId=99", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/users/{appUserId}", "/subscriptions-api/internal/v1/users/user-1", [], nil),
            ("put", "/subscriptions-api/public/v1/users/{appUserId}/attributes", "/subscriptions-api/public/v1/users/user-1/attributes?applicationId=7", [auth], Array(#"{"attributes": {"plan": "team", "seats": 5}}"#.utf8)),
            ("put", "/subscriptions-api/public/v1/users/{appUserId}/attributes", "/subscriptions-api/public/v1/users/user-1/attributes?applicationId=7", [auth], Array(#"{"attributes": {"nested": {"a": 1}}}"#.utf8)),
            // Without a record log (this backend has none) purchases and grants are not taken.
            ("post", "/subscriptions-api/public/v1/users/{appUserId}/purchases", "/subscriptions-api/public/v1/users/user-1/purchases?applicationId=7", [auth], Array(#"{"store": "APP_STORE", "signedTransaction": "a.b.c"}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/users/{appUserId}/purchases", "/subscriptions-api/public/v1/users/user-1/purchases", [], Array(#"{}"#.utf8)),
            ("post", "/subscriptions-api/internal/v1/users/{appUserId}/grants", "/subscriptions-api/internal/v1/users/user-1/grants", [auth], Array(#"{"app": "x", "entitlement": "pro", "lifetime": true}"#.utf8)),
            ("post", "/subscriptions-api/internal/v1/users/{appUserId}/grants", "/subscriptions-api/internal/v1/users/user-1/grants", [], Array(#"{}"#.utf8)),
            ("delete", "/subscriptions-api/internal/v1/users/{appUserId}/grants/{grantId}", "/subscriptions-api/internal/v1/users/user-1/grants/grant_0", [auth], nil),
            // No web checkout here (no apps[].web, no log): 404 past the key.
            ("post", "/subscriptions-api/public/v1/checkout/session", "/subscriptions-api/public/v1/checkout/session?applicationId=7", [auth], Array(#"{"productIdentifier": "price_x"}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/redeem", "/subscriptions-api/public/v1/redeem?applicationId=7", [auth], Array(#"{"codes": [{"code": "x"}]}"#.utf8)),
            ("post", "/subscriptions-api/public/v1/redeem", "/subscriptions-api/public/v1/redeem", [], Array(#"{}"#.utf8)),
            // Endpoint health; the delivery actions need the log, which this backend does not have (503).
            ("get", "/subscriptions-api/internal/v1/endpoints", "/subscriptions-api/internal/v1/endpoints", [auth], nil),
            ("get", "/subscriptions-api/internal/v1/endpoints", "/subscriptions-api/internal/v1/endpoints?endpoint=nope", [auth], nil),
            ("post", "/subscriptions-api/internal/v1/deliveries/{deliveryId}/resend", "/subscriptions-api/internal/v1/deliveries/x/resend", [auth], nil),
            ("post", "/subscriptions-api/internal/v1/endpoints/{endpointId}/recover", "/subscriptions-api/internal/v1/endpoints/x/recover?since=2026-01-01", [auth], nil),
            ("post", "/subscriptions-api/internal/v1/endpoints/{endpointId}/enable", "/subscriptions-api/internal/v1/endpoints/x/enable", [auth], nil),
            ("post", "/subscriptions-api/internal/v1/endpoints/{endpointId}/enable", "/subscriptions-api/internal/v1/endpoints/x/enable", [], nil),
        ]
        var statuses: [Int] = []
        for call in calls {
            let response = try await http.send(call.method.uppercased(), backend.url + call.url, headers: call.headers, body: call.body)
            let operation = (paths[call.template] as? [String: Any])?[call.method] as? [String: Any]
            let documented = Set(((operation?["responses"] as? [String: Any]) ?? [:]).keys)
            #expect(documented.contains(String(response.status)), "\(call.method) \(call.url) answered \(response.status), documented \(documented.sorted())")
            statuses.append(response.status)
        }
        #expect(statuses == [
            200, 404, 200, 401, 200, 412, 409, 200, 200, 200, 404, 200, 400, 200, 401, 200, 400, 401, 200, 404, 200, 400, 200, 400, 404, 401, 200, 400, 404,
            200, 404, 401, 200, 400, 404, 401, 404, 401, 404, 404, 404, 401, 200, 404, 503, 503, 503, 401,
        ])
        await backend.stop()
    }
}

/// The local backend's database: group-committed writes, each still checked against its own version.
