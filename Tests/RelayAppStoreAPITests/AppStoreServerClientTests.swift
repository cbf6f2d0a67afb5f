import Foundation
import Logging
import RelayAppStoreAPI
import RelayCore
import RelayCrypto
import RelayHTTPClient
import RelayTestSupport
import Testing


let testHTTPClient = HTTPClient(connectTimeout: .seconds(2), timeout: .seconds(10), maxConcurrentTransfers: 8)

/// A request target split into its path and its decoded query parameters, in order.
func target(_ request: TestHTTPRequest) -> (path: String, query: [String]) {
    let parts = request.path.split(separator: "?", maxSplits: 1)
    let query = parts.count > 1 ? parts[1].split(separator: "&").map { String($0).removingPercentEncoding ?? "" } : []
    return (String(parts[0]), query)
}

/// `text` holds no JWT (or anything JWT-looking) and no private key.
func expectNoSecrets(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(!text.contains("eyJ"), "JWT in: \(text)", sourceLocation: sourceLocation)
    #expect(!text.contains("PRIVATE KEY"), "private key in: \(text)", sourceLocation: sourceLocation)
    #expect(!text.contains(Fixtures.text(FakeAppStore.keyFile).split(separator: "\n")[1]), "key material in: \(text)", sourceLocation: sourceLocation)
}

@Suite struct AppStoreServerClientTests {
    static let emptyHistory: JSON = ["revision": "r-end", "hasMore": false, "signedTransactions": []]

    // MARK: Tokens

    @Test func theTokenIsAnES256JWTWithTheDocumentedHeaderAndClaims() throws {
        let now: Int64 = 1_900_000_000
        let tokens = AppStoreTokenSource(key: try FakeAppStore.key(), now: { now })
        let token = try tokens.token()
        #expect(token.issuedAt == now)
        #expect(token.expiresAt == now + 1200)

        let parts = token.value.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        let strict = { (part: Substring) in Base64.decode(Array(part.utf8), alphabet: .url, padding: .forbidden, canonical: true) }
        let header = try JSON.parse(try #require(strict(parts[0])))
        let claims = try JSON.parse(try #require(strict(parts[1])))
        let signature = try #require(strict(parts[2]))
        #expect(header == ["alg": "ES256", "kid": "TESTKEY123", "typ": "JWT"])
        #expect(
            claims == [
                "iss": .string(FakeAppStore.issuerId), "iat": .integer(now), "exp": .integer(now + 1200), "aud": "appstoreconnect-v1",
                "bid": "com.example.app",
            ])
        #expect(signature.count == 64, "raw r‖s, not DER")
        let publicKey = Fixtures.privateKey(FakeAppStore.keyFile).publicKey
        #expect(publicKey.verifyES256(Array("\(parts[0]).\(parts[1])".utf8), rawSignature: signature))
        #expect(!Fixtures.privateKey("apple/rogue-leaf.key").publicKey.verifyES256(Array("\(parts[0]).\(parts[1])".utf8), rawSignature: signature))
        #expect(FakeAppStore.tokenProblem("Bearer \(token.value)", publicKey: publicKey, now: now) == nil)

        expectNoSecrets(token.description)
        expectNoSecrets(tokens.key.description)
    }

    @Test func theTokenIsReusedUntilFiveMinutesBeforeItExpires() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(Self.emptyHistory) }
        let client = try store.client()
        let start = store.clock.value
        _ = try await client.transactionHistoryPage(transactionId: "1")
        store.clock.withLock { $0 = start + 899 }
        _ = try await client.transactionHistoryPage(transactionId: "1")
        store.clock.withLock { $0 = start + 900 }  // 20 min lifetime - 5 min margin
        _ = try await client.transactionHistoryPage(transactionId: "1")
        let tokens = store.requests.map { $0.headers["authorization"] }
        #expect(tokens.count == 3)
        #expect(tokens[0] == tokens[1])
        #expect(tokens[1] != tokens[2])
        #expect(store.refusals.value.isEmpty)
        await store.stop()
    }

    @Test func keyFilesAndIdsAreValidated() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-appstore-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let p8 = directory.appendingPathComponent("AuthKey_TESTKEY123.p8").path
        try Fixtures.text(FakeAppStore.keyFile).write(toFile: p8, atomically: true, encoding: .utf8)
        let loaded = try AppStoreConnectKey.load(path: p8, keyId: " TESTKEY123\n", issuerId: FakeAppStore.issuerId, bundleId: "com.example.app")
        #expect(loaded.keyId == "TESTKEY123", "trimmed")

        let garbage = "-----BEGIN PRIVATE KEY-----\nTm90IGEga2V5IGF0IGFsbA==\n-----END PRIVATE KEY-----\n"
        let cases: [(make: () throws(AppStoreAPIError) -> AppStoreConnectKey, mentions: [String])] = [
            ({ () throws(AppStoreAPIError) in try AppStoreConnectKey.load(path: directory.path + "/missing.p8", keyId: "K", issuerId: "I", bundleId: "B") },
             ["missing.p8", "cannot read"]),
            ({ () throws(AppStoreAPIError) in try AppStoreConnectKey(pem: garbage, keyId: "K", issuerId: "I", bundleId: "B") }, ["not a PEM private key", ".p8"]),
            ({ () throws(AppStoreAPIError) in
                try AppStoreConnectKey(pem: Fixtures.text("google/service-account.key"), keyId: "K", issuerId: "I", bundleId: "B")
            }, ["not an EC P-256 key"]),
            ({ () throws(AppStoreAPIError) in try AppStoreConnectKey(pem: Fixtures.text(FakeAppStore.keyFile), keyId: " ", issuerId: "I", bundleId: "B") },
             ["key id is empty"]),
            ({ () throws(AppStoreAPIError) in try AppStoreConnectKey(pem: Fixtures.text(FakeAppStore.keyFile), keyId: "K", issuerId: "", bundleId: "B") },
             ["issuer id is empty"]),
            ({ () throws(AppStoreAPIError) in try AppStoreConnectKey(pem: Fixtures.text(FakeAppStore.keyFile), keyId: "K", issuerId: "I", bundleId: "") },
             ["bundle id is empty"]),
        ]
        for (make, mentions) in cases {
            do {
                _ = try make()
                Issue.record("accepted: \(mentions)")
            } catch {
                #expect(error.kind == .configuration)
                for mention in mentions { #expect(error.message.contains(mention), "\(error.message) names \(mention)") }
                #expect(!error.message.contains("Tm90IGEga2V5"))
                expectNoSecrets(error.description)
            }
        }
        #expect(throws: AppStoreAPIError.self) {
            try AppStoreServerClient(key: try FakeAppStore.key(), environment: .production, baseURL: "api.example.com", logger: testLogger())
        }
    }

    @Test func theEnvironmentsUseApplesURLs() throws {
        #expect(AppStoreServerEnvironment.production.baseURL == "https://api.storekit.apple.com")
        #expect(AppStoreServerEnvironment.sandbox.baseURL == "https://api.storekit-sandbox.apple.com")
        let client = try AppStoreServerClient(key: try FakeAppStore.key(), environment: .sandbox, logger: testLogger())
        #expect(client.baseURL == "https://api.storekit-sandbox.apple.com")
    }

    // MARK: Get Transaction History

    @Test func transactionHistoryFollowsTheRevisionAcrossPagesWithTheSameFilters() async throws {
        let pages: [JSON] = [
            ["revision": "rev-1", "hasMore": true, "bundleId": "com.example.app", "appAppleId": 1234, "environment": "Sandbox",
             "signedTransactions": ["jws-1", "jws-2"]],
            ["revision": "rev-2", "hasMore": true, "environment": "Sandbox", "signedTransactions": ["jws-3"]],
            ["revision": "rev-3", "hasMore": false, "environment": "Sandbox", "signedTransactions": ["jws-4"]],
        ]
        let store = try await FakeAppStore { _, index in FakeAppStore.json(pages[index]) }
        let client = try store.client()
        let query = TransactionHistoryQuery(
            startDate: 1_700_000_000_000, productIds: ["pro.monthly", "coins 100"], productTypes: [.autoRenewable, .consumable], sort: .descending,
            revoked: false)
        var collected: [TransactionHistoryPage] = []
        for try await page in client.transactionHistory(transactionId: "2000000123456789", query: query) { collected.append(page) }

        #expect(collected.flatMap(\.signedTransactions) == ["jws-1", "jws-2", "jws-3", "jws-4"])
        #expect(collected.map(\.revision) == ["rev-1", "rev-2", "rev-3"])
        #expect(collected.first?.appAppleId == 1234)
        #expect(collected.first?.bundleId == "com.example.app")
        let filters = [
            "startDate=1700000000000", "productId=pro.monthly", "productId=coins 100", "productType=AUTO_RENEWABLE", "productType=CONSUMABLE",
            "sort=DESCENDING", "revoked=false",
        ]
        let targets = store.requests.map(target)
        #expect(targets.map(\.path) == Array(repeating: "/inApps/v2/history/2000000123456789", count: 3))
        #expect(targets[0].query == filters)
        #expect(targets[1].query == ["revision=rev-1"] + filters)
        #expect(targets[2].query == ["revision=rev-2"] + filters)
        #expect(store.requests.allSatisfy { $0.method == "GET" && $0.headers["accept"] == "application/json" })
        #expect(store.refusals.value.isEmpty)
        await store.stop()
    }

    @Test func transactionHistoryResumesFromAStoredRevision() async throws {
        let store = try await FakeAppStore { _, _ in
            FakeAppStore.json(["revision": "rev-9", "hasMore": false, "signedTransactions": ["jws-9"]])
        }
        let client = try store.client()
        var pages = 0
        for try await page in client.transactionHistory(transactionId: "42", startingAt: "rev-8") {
            #expect(page.signedTransactions == ["jws-9"])
            pages += 1
        }
        #expect(pages == 1)
        #expect(store.requests.map { target($0).query } == [["revision=rev-8"]])
        // One page by hand, with a transaction id that needs encoding.
        _ = try await client.transactionHistoryPage(transactionId: "a/b..", revision: "rev+/=")
        #expect(store.requests.last?.path == "/inApps/v2/history/a%2Fb..?revision=rev%2B%2F%3D")
        await store.stop()
    }

    @Test func aPageThatRepeatsItsRevisionEndsTheWalk() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(["revision": "stuck", "hasMore": true, "signedTransactions": ["jws"]]) }
        let client = try store.client()
        var pages = 0
        let error = await caughtError(AppStoreAPIError.self) {
            for try await _ in client.transactionHistory(transactionId: "1") { pages += 1 }
        }
        #expect(error?.kind == .invalidResponse)
        #expect(pages == 1)
        #expect(store.requests.count == 2)
        await store.stop()
    }

    // MARK: Get Notification History

    @Test func notificationHistoryPostsTheRequestAndFollowsThePaginationToken() async throws {
        let pages: [JSON] = [
            ["paginationToken": "page-2", "hasMore": true,
             "notificationHistory": [
                ["signedPayload": "payload-1", "sendAttempts": [
                    ["attemptDate": 1_700_000_000_000, "sendAttemptResult": "TIMED_OUT"],
                    ["attemptDate": 1_700_000_360_000, "sendAttemptResult": "SUCCESS"],
                ]],
                ["signedPayload": "payload-2", "sendAttempts": []],
             ]],
            ["paginationToken": "page-3", "hasMore": false, "notificationHistory": [["signedPayload": "payload-3"]]],
        ]
        let store = try await FakeAppStore { _, index in FakeAppStore.json(pages[index]) }
        let client = try store.client()
        let request = NotificationHistoryRequest(startDate: 1_699_000_000_000, endDate: 1_701_000_000_000, notificationType: "REFUND", onlyFailures: true)
        var collected: [NotificationHistoryPage] = []
        for try await page in client.notificationHistory(request) { collected.append(page) }

        #expect(collected.flatMap(\.notificationHistory).map(\.signedPayload) == ["payload-1", "payload-2", "payload-3"])
        #expect(
            collected.first?.notificationHistory.first?.sendAttempts == [
                SendAttempt(attemptDate: 1_700_000_000_000, sendAttemptResult: "TIMED_OUT"),
                SendAttempt(attemptDate: 1_700_000_360_000, sendAttemptResult: "SUCCESS"),
            ])
        #expect(collected.last?.notificationHistory.first?.sendAttempts == [])
        #expect(store.requests.map(\.path) == ["/inApps/v1/notifications/history", "/inApps/v1/notifications/history?paginationToken=page-2"])
        for sent in store.requests {
            #expect(sent.method == "POST")
            #expect(sent.headers["content-type"] == "application/json")
            #expect(
                try JSON.parse(sent.body) == [
                    "startDate": 1_699_000_000_000, "endDate": 1_701_000_000_000, "notificationType": "REFUND", "onlyFailures": true,
                ], "unset fields are left out")
        }
        await store.stop()
    }

    @Test func aNotificationHistoryPageByTokenSendsTheCustomerFilter() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(["hasMore": false, "notificationHistory": []]) }
        let page = try await store.client().notificationHistoryPage(
            NotificationHistoryRequest(startDate: 1, endDate: 2, transactionId: "2000000000000001"), paginationToken: "tok/en")
        #expect(page.notificationHistory.isEmpty)
        #expect(!page.hasMore)
        let sent = try #require(store.requests.first)
        #expect(sent.path == "/inApps/v1/notifications/history?paginationToken=tok%2Fen")
        #expect(try JSON.parse(sent.body) == ["startDate": 1, "endDate": 2, "transactionId": "2000000000000001"])
        await store.stop()
    }

    // MARK: Get All Subscription Statuses

    @Test func subscriptionStatusesDecode() async throws {
        let response: JSON = [
            "environment": "Sandbox", "bundleId": "com.example.app", "appAppleId": 1234,
            "data": [
                ["subscriptionGroupIdentifier": "21000001",
                 "lastTransactions": [
                    ["originalTransactionId": "1000", "status": 1, "signedTransactionInfo": "tx-1000", "signedRenewalInfo": "renewal-1000"],
                    ["originalTransactionId": "1001", "status": 5, "signedTransactionInfo": "tx-1001", "signedRenewalInfo": "renewal-1001"],
                 ]],
                ["subscriptionGroupIdentifier": "21000002",
                 "lastTransactions": [["originalTransactionId": "2000", "status": 9, "signedTransactionInfo": "tx-2000"]]],
            ],
        ]
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(response) }
        let statuses = try await store.client().subscriptionStatuses(transactionId: "1000", statuses: [.active, .billingGracePeriod])
        #expect(statuses.environment == "Sandbox")
        #expect(statuses.bundleId == "com.example.app")
        #expect(statuses.appAppleId == 1234)
        #expect(statuses.data.map(\.subscriptionGroupIdentifier) == ["21000001", "21000002"])
        let first = try #require(statuses.data.first?.lastTransactions)
        #expect(
            first == [
                LastTransaction(originalTransactionId: "1000", status: 1, signedTransactionInfo: "tx-1000", signedRenewalInfo: "renewal-1000"),
                LastTransaction(originalTransactionId: "1001", status: 5, signedTransactionInfo: "tx-1001", signedRenewalInfo: "renewal-1001"),
            ])
        #expect(first.map(\.subscriptionStatus) == [.active, .revoked])
        let unknown = try #require(statuses.data.last?.lastTransactions.first)
        #expect(unknown.status == 9)
        #expect(unknown.subscriptionStatus == nil, "a status Apple adds later still decodes")
        #expect(unknown.signedRenewalInfo == nil)
        #expect(store.requests.map(\.path) == ["/inApps/v1/subscriptions/1000?status=1&status=4"])
        await store.stop()
    }

    // MARK: Send Consumption Information

    @Test func consumptionInformationIsPutAsJSONAndAccepted() async throws {
        let store = try await FakeAppStore { _, _ in TestHTTPResponse(status: 202) }
        let client = try store.client()
        try await client.sendConsumptionInformation(
            transactionId: "3000",
            ConsumptionRequest(
                customerConsented: true, deliveryStatus: .delivered, sampleContentProvided: false, consumptionPercentage: 25_000,
                refundPreference: .grantProrated))
        let sent = store.requests
        #expect(sent.map(\.method) == ["PUT"])
        #expect(sent.map(\.path) == ["/inApps/v2/transactions/consumption/3000"])
        #expect(sent.allSatisfy { $0.headers["content-type"] == "application/json" })
        #expect(
            try JSON.parse(sent[0].body) == [
                "customerConsented": true, "deliveryStatus": "DELIVERED", "sampleContentProvided": false, "consumptionPercentage": 25_000,
                "refundPreference": "GRANT_PRORATED",
            ])
        await store.stop()
    }

    // MARK: Failures

    @Test func a429WithRetryAfterIsWaitedForThenSucceeds() async throws {
        let logs = LogRecorder(label: "appstore-test")
        let store = try await FakeAppStore { _, index in
            index == 0
                ? FakeAppStore.appleError(429, 4_290_000, "Rate limit exceeded.", headers: [("Retry-After", "1")])
                : FakeAppStore.json(Self.emptyHistory)
        }
        let started = ContinuousClock.now
        let page = try await store.client(logger: logs.logger).transactionHistoryPage(transactionId: "1")
        let elapsed = ContinuousClock.now - started
        #expect(page.revision == "r-end")
        #expect(elapsed >= .seconds(1), "waited the Retry-After, not the 10 ms delay")
        #expect(elapsed < .seconds(5))
        #expect(store.requests.count == 2)
        #expect(logs.text.contains("4290000"))
        expectNoSecrets(logs.text)
        await store.stop()
    }

    @Test func aRetryAfterBeyondTheLimitIsReturnedNotWaitedFor() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.appleError(429, 4_290_000, "Rate limit exceeded.", headers: [("Retry-After", "120")]) }
        let started = ContinuousClock.now
        let error = try #require(await caughtError(AppStoreAPIError.self) { _ = try await store.client().subscriptionStatuses(transactionId: "1") })
        #expect(ContinuousClock.now - started < .seconds(5))
        #expect(error.kind == .unavailable)
        #expect(error.isRetriable)
        #expect(error.status == 429)
        #expect(error.errorCode == 4_290_000)
        #expect(error.retryAfter == .seconds(120))
        #expect(error.message.contains("rate limit"))
        #expect(store.requests.count == 1)
        await store.stop()
    }

    @Test func serverErrorsAreRetriedThenUnavailable() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.appleError(500, 5_000_000, "An unknown error occurred.") }
        let error = try #require(await caughtError(AppStoreAPIError.self) { _ = try await store.client().transactionHistoryPage(transactionId: "1") })
        #expect(error.kind == .unavailable)
        #expect(error.status == 500)
        #expect(error.errorCode == 5_000_000)
        #expect(store.requests.count == 3, "one attempt and the policy's two retries")

        let recovering = try await FakeAppStore { _, index in
            index < 2 ? TestHTTPResponse(status: 503, text: "busy") : FakeAppStore.json(Self.emptyHistory)
        }
        #expect(try await recovering.client().transactionHistoryPage(transactionId: "1").revision == "r-end")
        #expect(recovering.requests.count == 3)
        await store.stop()
        await recovering.stop()
    }

    @Test func a401IsTheKeyRefusedAndNotRetried() async throws {
        let logs = LogRecorder(label: "appstore-test")
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(Self.emptyHistory) }
        // Signed with another key than the one Apple (the fake) holds for TESTKEY123.
        let wrongKey = try FakeAppStore.key(pem: Fixtures.text("apple/rogue-leaf.key"))
        let client = try store.client(key: wrongKey, logger: logs.logger)
        let error = try #require(await caughtError(AppStoreAPIError.self) { _ = try await client.transactionHistoryPage(transactionId: "1") })
        #expect(error.kind == .keyRefused)
        #expect(!error.isRetriable)
        #expect(error.status == 401)
        #expect(error.message.contains("TESTKEY123"))
        #expect(error.message.contains(FakeAppStore.issuerId))
        #expect(error.message.contains("clock"))
        #expect(store.requests.count == 1, "not retried")
        #expect(store.refusals.value == ["bad signature"])
        expectNoSecrets(error.description)
        expectNoSecrets(logs.text)

        // The refused token is dropped: the next call signs a new one (ES256 signatures differ each time).
        _ = await caughtError(AppStoreAPIError.self) { _ = try await client.transactionHistoryPage(transactionId: "1") }
        let sent = store.requests.map { $0.headers["authorization"] }
        #expect(sent.count == 2)
        #expect(sent[0] != sent[1])
        await store.stop()
    }

    @Test func anExpiredTokenIsRefusedByTheFakeServer() async throws {
        // Guards the fake itself: a token from a clock 21 minutes behind is refused as expired.
        let store = try await FakeAppStore { _, _ in FakeAppStore.json(Self.emptyHistory) }
        let behind = try AppStoreServerClient(
            key: try FakeAppStore.key(), environment: .sandbox, baseURL: store.baseURL, http: testHTTPClient, retry: FakeAppStore.fastRetries,
            logger: testLogger(), now: { [clock = store.clock] in clock.value - 21 * 60 })
        let error = await caughtError(AppStoreAPIError.self) { _ = try await behind.transactionHistoryPage(transactionId: "1") }
        #expect(error?.kind == .keyRefused)
        #expect(store.refusals.value == ["expired"])
        await store.stop()
    }

    @Test func a404IsNotFoundButApplesRetryable404sAreRetried() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.appleError(404, 4_040_010, "Transaction id not found.") }
        let error = try #require(await caughtError(AppStoreAPIError.self) { _ = try await store.client().subscriptionStatuses(transactionId: "999") })
        #expect(error.kind == .notFound)
        #expect(error.errorCode == 4_040_010)
        #expect(!error.isRetriable)
        #expect(error.message.contains("999"))
        #expect(error.message.contains("Transaction id not found."))
        #expect(error.message.contains("sandbox"), "names the environment asked")
        #expect(store.requests.count == 1)

        let notYet = try await FakeAppStore { _, index in
            index == 0
                ? FakeAppStore.appleError(404, 4_040_006, "Original transaction id not found. Please try again.")
                : FakeAppStore.json(["data": []])
        }
        #expect(try await notYet.client().subscriptionStatuses(transactionId: "999").data.isEmpty)
        #expect(notYet.requests.count == 2)
        await store.stop()
        await notYet.stop()
    }

    @Test func a400IsRejectedWithApplesErrorCode() async throws {
        let store = try await FakeAppStore { _, _ in FakeAppStore.appleError(400, 4_000_035, "Invalid customer consented.") }
        let error = try #require(
            await caughtError(AppStoreAPIError.self) {
                try await store.client().sendConsumptionInformation(
                    transactionId: "1", ConsumptionRequest(customerConsented: false, deliveryStatus: .delivered, sampleContentProvided: false))
            })
        #expect(error.kind == .rejected)
        #expect(error.errorCode == 4_000_035)
        #expect(error.message.contains("Invalid customer consented."))
        #expect(store.requests.count == 1)
        await store.stop()
    }

    @Test func aBodyThatIsNotTheDocumentedJSONIsAnInvalidResponse() async throws {
        for body in ["<html>oops</html>", "[1, 2]", "{\"revision\": 7}"] {
            let store = try await FakeAppStore { _, _ in TestHTTPResponse(text: body) }
            let error = await caughtError(AppStoreAPIError.self) { _ = try await store.client().transactionHistoryPage(transactionId: "1") }
            #expect(error?.kind == .invalidResponse, "\(body)")
            #expect(store.requests.count == 1, "not retried")
            await store.stop()
        }
        let endless = try await FakeAppStore { _, _ in FakeAppStore.json(["hasMore": true, "signedTransactions": []]) }
        let error = await caughtError(AppStoreAPIError.self) { _ = try await endless.client().transactionHistoryPage(transactionId: "1") }
        #expect(error?.kind == .invalidResponse, "hasMore without a revision")
        await endless.stop()
    }

    @Test func aRefusedConnectionIsUnavailable() async throws {
        let closed = try await TestHTTPServer { _ in TestHTTPResponse() }
        let url = closed.baseURL
        await closed.stop()
        let client = try AppStoreServerClient(
            key: try FakeAppStore.key(), environment: .production, baseURL: url, http: testHTTPClient, retry: FakeAppStore.fastRetries,
            logger: testLogger())
        let error = await caughtError(AppStoreAPIError.self) { _ = try await client.transactionHistoryPage(transactionId: "1") }
        #expect(error?.kind == .unavailable)
        #expect(error?.status == nil)
        #expect(error?.message.contains("could not be reached") == true)
    }
}
