import Foundation
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import ServiceLifecycle
import Testing

/// The local backend on 127.0.0.1 (port 0) over a fresh SQLite file, at a fixed "now".
private final class CustomerInfoBackend: Sendable {
    static let now: Int64 = 2_000_000_000_000
    static let day: Int64 = 86_400_000

    let database: SubscriptionDatabase
    let url: String
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    init() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("customer-info") + "/backend.sqlite").path
        let configuration = try RelayConfiguration.parse(
            yaml: """
                backend: { url: "http://127.0.0.1:1", apiKey: "test-key", database: "\(path)", listen: "127.0.0.1:0" }
                apps:
                  - key: demo
                    projectId: 1
                    applicationId: 7
                    stripe: { signingSecrets: ["whsec_x"] }
                    products:
                      - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
                      - { productId: com.example.plus, store: APP_STORE, entitlements: [plus, pro] }
                      - { productId: com.example.lifetime, store: APP_STORE, entitlements: [lifetime] }
                      - { productId: premium_sub, store: PLAY_STORE, entitlements: [premium] }
                  - key: web
                    projectId: 1
                    applicationId: 8
                    stripe: { signingSecrets: ["whsec_y"] }
                    products:
                      - { productId: prod_pro, store: STRIPE, entitlements: [pro] }
                """,
            baseDirectory: "/", environment: [:])
        database = try SubscriptionDatabase(path: path)
        let backend = try LocalBackend(configuration: configuration, database: database, clock: { Self.now })
        let ports = AsyncStream.makeStream(of: Int.self)
        let application = backend.application(logger: testLogger()) { port in ports.continuation.yield(port) }
        let group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: testLogger())
        self.group = group
        task = Task { try await group.run() }
        var iterator = ports.stream.makeAsyncIterator()
        url = "http://127.0.0.1:\(await iterator.next() ?? 0)"
    }

    func store(_ states: SubscriptionState...) async throws {
        for state in states {
            guard case .written = try await database.write(state, ifMatch: 0) else { throw TestFailure("\(state.originalTransactionId) not written") }
        }
    }

    /// GET `path` with the API key: the status and the body's JSON.
    func get(_ path: String, apiKey: String = "test-key") async throws -> (status: Int, body: JSON, bytes: [UInt8]) {
        let response = try await HTTPClient().send("GET", url + path, headers: [("Authorization", "Bearer \(apiKey)")])
        return (response.status, (try? JSON.parse(response.body)) ?? .null, response.body)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

private struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

private let now = CustomerInfoBackend.now
private let day = CustomerInfoBackend.day

private func state(
    _ id: String, store: Store = .apple, users: [String] = ["user-1"], product: String, group: String? = nil, status: SubscriptionState.Status = .active,
    autoRenew: Bool = true, expiresAt: Int64?, grace: Int64? = nil, payments: [(String, Int64)] = [], periodType: SubscriptionState.PeriodType = .normal,
    application: Int = 7
) -> SubscriptionState {
    SubscriptionState(
        store: store, originalTransactionId: id, applicationId: application, originalAppUserId: users.first, appUserIds: users, productId: product,
        productGroupId: group, status: status, periodType: periodType, autoRenew: autoRenew, expiresAt: expiresAt, gracePeriodExpiresAt: grace, environment: "SANDBOX",
        lastTransactionId: payments.last?.0, sourceTimestamp: now - day, recentNotifications: [.init(id: "n-\(id)", context: ["seen": true])],
        transactions: payments.map { .init(id: $0.0, productId: product, purchasedAt: $0.1, periodType: periodType, amount: "9.99", currency: "USD") })
}

/// The members SuperwallKit and Superwall-Android require (decode without a default), with their JSON types.
private let requiredSubscriptionMembers: [String: @Sendable (JSON) -> Bool] = [
    "transactionId": { $0.stringValue != nil }, "productId": { $0.stringValue != nil }, "purchaseDate": { $0.int64Value != nil },
    "willRenew": { $0.boolValue != nil }, "isRevoked": { $0.boolValue != nil }, "isInGracePeriod": { $0.boolValue != nil },
    "isInBillingRetryPeriod": { $0.boolValue != nil }, "isActive": { $0.boolValue != nil }, "store": { $0.stringValue != nil },
    "expirationDate": { $0.int64Value != nil || $0.isNull }, "offerType": { $0.stringValue != nil || $0.isNull },
    "subscriptionGroupId": { $0.stringValue != nil || $0.isNull },
]
private let requiredNonSubscriptionMembers: [String: @Sendable (JSON) -> Bool] = [
    "transactionId": { $0.stringValue != nil }, "productId": { $0.stringValue != nil }, "purchaseDate": { $0.int64Value != nil },
    "isConsumable": { $0.boolValue != nil }, "isRevoked": { $0.boolValue != nil }, "store": { $0.stringValue != nil },
]
private let entitlementMembers = [
    "identifier", "type", "isActive", "productIds", "latestProductId", "store", "startsAt", "renewedAt", "expiresAt", "isLifetime", "willRenew", "state",
    "offerType",
]

@Suite struct CustomerInfoTests {
    /// A Play plan change: the old token, which Play may still show active, is listed as replaced and
    /// unlocks nothing; only the new plan's entitlements are the user's.
    @Test func aReplacedSubscriptionIsListedButGivesNoAccess() async throws {
        let backend = try await CustomerInfoBackend()
        var old = state("token-old", store: .google, product: "premium_sub:monthly", group: "premium_sub", expiresAt: now + 20 * day, payments: [("GPA.old", now - 10 * day)])
        old.replacedBy = "token-new"
        try await backend.store(old, state("token-new", product: "com.example.pro.monthly", expiresAt: now + 30 * day, payments: [("GPA.new", now - day)]))
        let document = try await backend.get("/subscriptions-api/public/v1/users/user-1/entitlements").body
        #expect(document["entitlements"] == [["identifier": "pro", "type": "SERVICE_LEVEL"]])
        let replaced = try #require(document["customerInfo"]?["subscriptions"]?.arrayValue?.first { $0["originalTransactionId"] == "token-old" })
        #expect(replaced["isActive"] == false)
        #expect(replaced["willRenew"] == false)
        #expect(replaced["replacedBy"] == "token-new")
        let premium = try #require(document["customerInfo"]?["entitlements"]?.arrayValue?.first { $0["identifier"] == "premium" })
        #expect(premium["isActive"] == false)
        #expect(premium["state"] == "expired")
        await backend.stop()
    }

    @Test func activeExpiredOneTimeAndGracePeriodInTheSDKShapes() async throws {
        let backend = try await CustomerInfoBackend()
        try await backend.store(
            state("sub-active", product: "com.example.pro.monthly", expiresAt: now + day, payments: [("t-a1", now - 40 * day), ("t-a2", now - 10 * day)]),
            state("sub-expired", product: "com.example.plus", status: .expired, autoRenew: false, expiresAt: now - day, payments: [("t-e1", now - 60 * day)]),
            state("lifetime-1", product: "com.example.lifetime", autoRenew: false, expiresAt: nil, payments: [("t-l1", now - 5 * day)]),
            state(
                "token-grace", store: .google, product: "premium_sub:monthly", group: "premium_sub", status: .inGracePeriod, expiresAt: now - 3_600_000,
                grace: now + 2 * day, payments: [("GPA.1", now - 31 * day)], periodType: .intro))

        let response = try await backend.get("/subscriptions-api/public/v1/users/user-1/entitlements")
        #expect(response.status == 200)
        let document = response.body
        #expect(document["entitlements"] == [
            ["identifier": "lifetime", "type": "SERVICE_LEVEL"], ["identifier": "premium", "type": "SERVICE_LEVEL"], ["identifier": "pro", "type": "SERVICE_LEVEL"],
        ])
        let info = try #require(document["customerInfo"])
        #expect(Set(info.objectValue?.keys.map { $0 } ?? []) == ["subscriptions", "nonSubscriptions", "entitlements"])

        // Subscriptions, oldest purchase first; each with the SDK's members (null ones present) and the stored state's.
        let subscriptions = try #require(info["subscriptions"]?.arrayValue)
        #expect(subscriptions.map { $0["originalTransactionId"] } == ["sub-expired", "token-grace", "sub-active"])
        for entry in subscriptions {
            for (member, valid) in requiredSubscriptionMembers {
                #expect(entry[member].map(valid) == true, "\(member) in \(entry)")
            }
            #expect(entry["recentNotifications"] == nil, "the worker's bookkeeping stays inside")
            #expect((try? SubscriptionState(customerInfoEntry: entry)) != nil, "the stored state's members are all there")
        }
        let active = subscriptions[2]
        #expect(active["transactionId"] == "t-a2")
        #expect(active["purchaseDate"] == .integer(now - 10 * day))
        #expect(active["expirationDate"] == .integer(now + day))
        #expect(active["isActive"] == true)
        #expect(active["willRenew"] == true)
        #expect(active["isRevoked"] == false)
        #expect(active["isInGracePeriod"] == false)
        #expect(active["offerType"] == .null)
        #expect(active["store"] == "APP_STORE")
        #expect(active["status"] == "ACTIVE")
        #expect(active["entitlements"] == ["pro"])
        let expired = subscriptions[0]
        #expect(expired["isActive"] == false)
        #expect(expired["willRenew"] == false)
        #expect(expired["isRevoked"] == false)
        #expect(expired["entitlements"] == ["plus", "pro"])
        let inGrace = subscriptions[1]
        #expect(inGrace["isActive"] == true)
        #expect(inGrace["isInGracePeriod"] == true)
        #expect(inGrace["isInBillingRetryPeriod"] == false)
        #expect(inGrace["willRenew"] == true)
        #expect(inGrace["store"] == "PLAY_STORE")
        #expect(inGrace["offerType"] == "trial")
        #expect(inGrace["subscriptionGroupId"] == "premium_sub")
        #expect(inGrace["expirationDate"] == .integer(now - 3_600_000))

        // The one-time purchase: no renewal, no expiry.
        let purchases = try #require(info["nonSubscriptions"]?.arrayValue)
        #expect(purchases.count == 1)
        for (member, valid) in requiredNonSubscriptionMembers {
            #expect(purchases.first?[member].map(valid) == true, "\(member)")
        }
        #expect(purchases.first?["transactionId"] == "t-l1")
        #expect(purchases.first?["productId"] == "com.example.lifetime")
        #expect(purchases.first?["purchaseDate"] == .integer(now - 5 * day))
        #expect(purchases.first?["isConsumable"] == false)
        #expect(purchases.first?["isRevoked"] == false)
        #expect(purchases.first?["isActive"] == true)
        #expect(purchases.first?["store"] == "APP_STORE")

        // Entitlements, sorted, every member present.
        let entitlements = try #require(info["entitlements"]?.arrayValue)
        #expect(entitlements.map { $0["identifier"] } == ["lifetime", "plus", "premium", "pro"])
        for entitlement in entitlements {
            #expect(Set(entitlement.objectValue?.keys.map { $0 } ?? []) == Set(entitlementMembers))
        }
        let byId = Dictionary(uniqueKeysWithValues: entitlements.map { ($0["identifier"]?.stringValue ?? "", $0) })
        #expect(byId["pro"] == [
            "identifier": "pro", "type": "SERVICE_LEVEL", "isActive": true, "productIds": ["com.example.plus", "com.example.pro.monthly"],
            "latestProductId": "com.example.pro.monthly", "store": "APP_STORE", "startsAt": .integer(now - 60 * day), "renewedAt": .integer(now - 10 * day),
            "expiresAt": .integer(now + day), "isLifetime": false, "willRenew": true, "state": "subscribed", "offerType": .null,
        ])
        #expect(byId["plus"]?["isActive"] == false)
        #expect(byId["plus"]?["state"] == "expired")
        #expect(byId["plus"]?["willRenew"] == false)
        #expect(byId["plus"]?["expiresAt"] == .integer(now - day))
        #expect(byId["premium"]?["isActive"] == true)
        #expect(byId["premium"]?["state"] == "inGracePeriod")
        #expect(byId["premium"]?["expiresAt"] == .integer(now + 2 * day), "access ends with the grace period")
        #expect(byId["premium"]?["store"] == "PLAY_STORE")
        #expect(byId["premium"]?["productIds"] == ["premium_sub", "premium_sub:monthly"])
        #expect(byId["premium"]?["offerType"] == "trial")
        #expect(byId["lifetime"] == [
            "identifier": "lifetime", "type": "SERVICE_LEVEL", "isActive": true, "productIds": ["com.example.lifetime"],
            "latestProductId": "com.example.lifetime", "store": "APP_STORE", "startsAt": .integer(now - 5 * day), "renewedAt": .null, "expiresAt": .null,
            "isLifetime": true, "willRenew": false, "state": .null, "offerType": .null,
        ])

        // The typed model reads it back, and its Codable form is the route's bytes (written by hand).
        let typed = try WireCoding.decode(UserEntitlements.self, from: response.bytes)
        #expect(WireCoding.encode(typed) == response.bytes)
        #expect(typed.customerInfo.subscriptions.map(\.state?.originalTransactionId) == ["sub-expired", "token-grace", "sub-active"])
        #expect(typed.customerInfo.nonSubscriptions.first?.state?.productId == "com.example.lifetime")
        await backend.stop()
    }

    @Test func aRefundedOneTimePurchaseIsRevokedAndUnlocksNothing() async throws {
        let backend = try await CustomerInfoBackend()
        try await backend.store(
            state("lifetime-2", users: ["user-2"], product: "com.example.lifetime", status: .refunded, autoRenew: false, expiresAt: nil, payments: [("t-r", now - day)]),
            state("sub-billing", users: ["user-2"], product: "com.example.pro.monthly", status: .inBillingRetry, expiresAt: now - day))
        let info = try #require(try await backend.get("/subscriptions-api/public/v1/users/user-2/entitlements").body["customerInfo"])
        #expect(info["nonSubscriptions"]?.arrayValue?.first?["isRevoked"] == true)
        #expect(info["nonSubscriptions"]?.arrayValue?.first?["isActive"] == false)
        let retrying = info["subscriptions"]?.arrayValue?.first
        #expect(retrying?["isInBillingRetryPeriod"] == true)
        #expect(retrying?["isActive"] == false)
        #expect(retrying?["willRenew"] == true, "Apple keeps retrying with auto-renew on")
        let entitlements = info["entitlements"]?.arrayValue ?? []
        #expect(entitlements.first { $0["identifier"] == "lifetime" }?["isActive"] == false)
        #expect(entitlements.first { $0["identifier"] == "lifetime" }?["isLifetime"] == false)
        #expect(entitlements.first { $0["identifier"] == "pro" }?["state"] == "inBillingRetryPeriod")
        #expect(try await backend.get("/subscriptions-api/public/v1/users/user-2/entitlements").body["entitlements"] == [])
        await backend.stop()
    }

    @Test func theDeviceIdAddsWhatWasBoughtOnTheDeviceOnce() async throws {
        let backend = try await CustomerInfoBackend()
        let device = "dev ice/1"
        try await backend.store(
            state("mine", users: ["user-9"], product: "com.example.pro.monthly", expiresAt: now + day, payments: [("t-m", now - 3 * day)]),
            state("anonymous", users: [device], product: "com.example.lifetime", autoRenew: false, expiresAt: nil, payments: [("t-d", now - 2 * day)]),
            state("shared", users: ["user-9", device], product: "com.example.plus", expiresAt: now + day, payments: [("t-s", now - day)]),
            state("someone-else", users: ["user-10"], product: "com.example.plus", expiresAt: now + day))
        func ids(_ path: String) async throws -> [JSON] {
            let info = try await backend.get(path).body["customerInfo"]
            return (info?["subscriptions"]?.arrayValue ?? []).map { $0["originalTransactionId"] ?? .null }
                + (info?["nonSubscriptions"]?.arrayValue ?? []).map { $0["originalTransactionId"] ?? .null }
        }
        #expect(try await ids("/subscriptions-api/public/v1/users/user-9/entitlements") == ["mine", "shared"])
        #expect(try await ids("/subscriptions-api/public/v1/users/user-9/entitlements?deviceId=dev%20ice%2F1") == ["mine", "shared", "anonymous"])
        // The SDK before login: the device id is the path and the query.
        #expect(try await ids("/subscriptions-api/public/v1/users/dev%20ice%2F1/entitlements?deviceId=dev%20ice%2F1") == ["shared", "anonymous"])
        let union = try await backend.get("/subscriptions-api/public/v1/users/user-9/entitlements?deviceId=dev%20ice%2F1").body
        #expect(union["entitlements"] == [
            ["identifier": "lifetime", "type": "SERVICE_LEVEL"], ["identifier": "plus", "type": "SERVICE_LEVEL"], ["identifier": "pro", "type": "SERVICE_LEVEL"],
        ])
        // An unknown device adds nothing.
        #expect(try await ids("/subscriptions-api/public/v1/users/user-9/entitlements?deviceId=unknown-device") == ["mine", "shared"])
        await backend.stop()
    }

    @Test func anUnknownIdHasEmptyLists() async throws {
        let backend = try await CustomerInfoBackend()
        let response = try await backend.get("/subscriptions-api/public/v1/users/nobody/entitlements?deviceId=fresh-install")
        #expect(response.status == 200)
        #expect(text(response.bytes) == #"{"customerInfo":{"entitlements":[],"nonSubscriptions":[],"subscriptions":[]},"entitlements":[]}"#)
        #expect(try await backend.get("/subscriptions-api/public/v1/users/nobody/entitlements", apiKey: "wrong").status == 401)
        await backend.stop()
    }

    @Test func productsAreListedInTheSDKShape() async throws {
        let backend = try await CustomerInfoBackend()
        let all = try await backend.get("/subscriptions-api/public/v1/products")
        #expect(all.status == 200)
        let products = try #require(all.body["data"]?.arrayValue)
        #expect(products.map { $0["identifier"] } == ["com.example.pro.monthly", "com.example.plus", "com.example.lifetime", "premium_sub", "prod_pro"])
        #expect(products.map { $0["platform"] } == ["ios", "ios", "ios", "android", "stripe"])
        #expect(products[1] == [
            "object": "product", "identifier": "com.example.plus", "platform": "ios", "store": "APP_STORE", "applicationId": 7, "price": .null,
            "subscription": .null, "entitlements": [["identifier": "plus", "type": "SERVICE_LEVEL"], ["identifier": "pro", "type": "SERVICE_LEVEL"]],
            "storefront": "USA",
        ])
        let catalog = try WireCoding.decode(ProductCatalog.self, from: all.bytes)
        #expect(catalog.data.map(\.applicationId) == [7, 7, 7, 7, 8])
        #expect(WireCoding.encode(catalog) == all.bytes)

        let web = try await backend.get("/subscriptions-api/public/v1/products?applicationId=8")
        #expect(web.body == [
            "data": [[
                "object": "product", "identifier": "prod_pro", "platform": "stripe", "store": "STRIPE", "applicationId": 8, "price": .null,
                "subscription": .null, "entitlements": [["identifier": "pro", "type": "SERVICE_LEVEL"]], "storefront": "USA",
            ]]
        ])
        #expect(try await backend.get("/subscriptions-api/public/v1/products?applicationId=99").status == 404)
        #expect(try await backend.get("/subscriptions-api/public/v1/products?applicationId=x").body["error"] == "bad_request")
        #expect(try await backend.get("/subscriptions-api/public/v1/products", apiKey: "wrong").status == 401)
        await backend.stop()
    }
}
