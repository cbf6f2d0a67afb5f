import Foundation
import Glibc
import RelayCore
import RelayTestSupport
import Testing

/// The executable's exit codes (docs/contracts.md, Command line): 64 bad arguments, 78 bad configuration.
@Suite struct CommandLineTests {
    /// `swift test` builds the executable next to the test bundle.
    static var executable: URL? {
        let candidates = [
            Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("revenue-relay"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("revenue-relay"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("revenue-relay"),
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) }
    }

    func run(_ arguments: [String]) async throws -> (status: Int32, stderr: String) {
        let executable: URL = try #require(Self.executable, "the revenue-relay executable was not built next to the tests")
        let result = try await runChildProcess(executable, arguments)
        return (result.status, result.stderr)
    }

    @Test func badConfigurationExits78AndNamesTheKey() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("bad") + ".yaml")
        try Data("ingest: { listen: \"127.0.0.1:0\", maxBodyBytez: 5 }\n".utf8).write(to: file)
        let result = try await run(["run", "--config", file.path, "--role", "ingest"])
        #expect(result.status == 78)
        #expect(result.stderr.contains("ingest.maxBodyBytez"))
        #expect(try await run(["run", "--config", "/nonexistent/relay.yaml"]).status == 78)
    }

    @Test func aKeyConfiguredTwiceExits78NamingBothPlacesButNotTheKey() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("keys") + ".yaml")
        try Data(
            """
            backend: { apiKey: "sk_backend_secret_0123", listen: "127.0.0.1:0", database: "\(file.path).sqlite" }
            apps:
              - { key: demo, projectId: 1, applicationId: 1, publicApiKeys: ["sk_backend_secret_0123"], stripe: { signingSecrets: [x] } }

            """.utf8
        ).write(to: file)
        let result = try await run(["run", "--config", file.path, "--role", "backend"])
        #expect(result.status == 78, "\(result.stderr)")
        #expect(result.stderr.contains("apps[0].publicApiKeys[0]"), "\(result.stderr)")
        #expect(result.stderr.contains("backend.apiKey"), "\(result.stderr)")
        #expect(!result.stderr.contains("sk_backend_secret_0123"))
    }

    @Test func aTakenAddressFailsAtOnceNamingItAndItsKey() async throws {
        let holder = try LoopbackListener { Glibc.close($0) }
        defer { holder.close() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("taken"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        // The dev configuration, with its ingest address on a port something else listens on.
        let dev = try String(contentsOfFile: "config/dev.yaml", encoding: .utf8)
            .replacingOccurrences(of: "listen: \"127.0.0.1:8080\"", with: "listen: \"127.0.0.1:\(holder.port)\"")
            .replacingOccurrences(of: "listen: \"127.0.0.1:8081\"", with: "listen: \"127.0.0.1:0\"")
            .replacingOccurrences(of: ": dev/", with: ": \(FileManager.default.currentDirectoryPath)/config/dev/")
            .replacingOccurrences(of: ", dev/", with: ", \(FileManager.default.currentDirectoryPath)/config/dev/")
            .replacingOccurrences(of: "[certs/", with: "[\(FileManager.default.currentDirectoryPath)/config/certs/")
        try Data(dev.utf8).write(to: file)
        let started = ContinuousClock.now
        let result = try await run(["dev", "--config", file.path, "--data", directory.appendingPathComponent("data").path])
        #expect(result.status == 78, "\(result.stderr)")
        #expect(result.stderr.contains("ingest.listen"))
        #expect(result.stderr.contains("127.0.0.1:\(holder.port)"))
        // At once: not after a timeout, and not never (it used to hang, ignoring SIGTERM).
        #expect(ContinuousClock.now - started < .seconds(20))
    }

    @Test func recoverStripeRefusesAnAppWithoutStripesAPIWith78() async throws {
        // config/dev.yaml's demo app takes Stripe's webhooks but has no stripe.api.
        let yesterday = Timestamp.rfc3339(milliseconds: Int64(Date().timeIntervalSince1970 * 1000) - 86_400_000)
        let result = try await run(["recover", "stripe", "--config", "config/dev.yaml", "--app", "demo", "--since", yesterday])
        #expect(result.status == 78, "\(result.stderr)")
        #expect(result.stderr.contains("apps[0].stripe.api"), "\(result.stderr)")
        #expect(try await run(["recover", "stripe", "--config", "config/dev.yaml", "--app", "demo"]).status == 64)
        // Its Google section has no playApi either.
        let google = try await run(["recover", "google", "--config", "config/dev.yaml", "--app", "demo", "--since", yesterday])
        #expect(google.status == 78, "\(google.stderr)")
        #expect(google.stderr.contains("apps[0].google.playApi"), "\(google.stderr)")
        let importing = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("import") + ".csv")
        try Data("tok-1,pro_monthly\n".utf8).write(to: importing)
        let imported = try await run(["import", "google", "--config", "config/dev.yaml", "--app", "demo", "--file", importing.path])
        #expect(imported.status == 78, "\(imported.stderr)")
        #expect(try await run(["import", "google", "--config", "config/dev.yaml", "--app", "demo", "--file", "/nonexistent.csv"]).status == 64)
        // And its Paddle section no api.
        let paddle = try await run(["recover", "paddle", "--config", "config/dev.yaml", "--app", "demo", "--since", yesterday])
        #expect(paddle.status == 78, "\(paddle.stderr)")
        #expect(paddle.stderr.contains("apps[0].paddle.api"), "\(paddle.stderr)")
        // Reconcile, the same.
        let reconcileGoogle = try await run(["reconcile", "google", "--config", "config/dev.yaml", "--app", "demo"])
        #expect(reconcileGoogle.status == 78, "\(reconcileGoogle.stderr)")
        #expect(reconcileGoogle.stderr.contains("apps[0].google.playApi"), "\(reconcileGoogle.stderr)")
        let reconcileStripe = try await run(["reconcile", "stripe", "--config", "config/dev.yaml", "--app", "demo"])
        #expect(reconcileStripe.status == 78, "\(reconcileStripe.stderr)")
        #expect(reconcileStripe.stderr.contains("apps[0].stripe.api"), "\(reconcileStripe.stderr)")
        let importStripe = try await run(["import", "stripe", "--config", "config/dev.yaml", "--app", "demo"])
        #expect(importStripe.status == 78, "\(importStripe.stderr)")
        #expect(importStripe.stderr.contains("apps[0].stripe.api"), "\(importStripe.stderr)")
        let importPaddle = try await run(["import", "paddle", "--config", "config/dev.yaml", "--app", "demo"])
        #expect(importPaddle.status == 78, "\(importPaddle.stderr)")
        // RevenueCat's export: a file that is not it, or still gzip-compressed, is a usage error naming what is wrong.
        let notExport = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("rc") + ".csv")
        try Data("purchase_token,product_id\nabc,pro\n".utf8).write(to: notExport)
        let wrong = try await run(["import", "revenuecat", "--config", "config/dev.yaml", "--app", "demo", "--file", notExport.path])
        #expect(wrong.status == 64, "\(wrong.stderr)")
        #expect(wrong.stderr.contains("rc_original_app_user_id"), "\(wrong.stderr)")
        let gzipped = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("rc") + ".csv.gz")
        try Data([0x1F, 0x8B, 0x08, 0x00]).write(to: gzipped)
        let compressed = try await run(["import", "revenuecat", "--config", "config/dev.yaml", "--app", "demo", "--file", gzipped.path])
        #expect(compressed.status == 64, "\(compressed.stderr)")
        #expect(compressed.stderr.contains("gunzip"), "\(compressed.stderr)")
        let reconcilePaddle = try await run(["reconcile", "paddle", "--config", "config/dev.yaml", "--app", "demo"])
        #expect(reconcilePaddle.status == 78, "\(reconcilePaddle.stderr)")
        #expect(reconcilePaddle.stderr.contains("apps[0].paddle.api"), "\(reconcilePaddle.stderr)")
    }

    @Test func badArgumentsExit64() async throws {
        #expect(try await run(["run", "--config", "config/dev.yaml", "--role", "accountant"]).status == 64)
        #expect(try await run(["run"]).status == 64)
        #expect(try await run(["frobnicate"]).status == 64)
    }
}

/// `revenue-relay inspect` (docs/contracts.md, Command line) on requests signed with the test fixtures, against
/// config/dev.yaml (which trusts the fixtures' Apple test root and Google JWKS).
@Suite struct InspectCommandTests {
    func inspect(_ arguments: [String], body: [UInt8]) async throws -> (status: Int32, output: JSON?, stderr: String) {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("request") + ".json")
        try Data(body).write(to: file)
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        let result = try await runChildProcess(executable, ["inspect", "--config", "config/dev.yaml"] + arguments + [file.path])
        return (result.status, try? JSON.parse(result.stdout), result.stderr)
    }

    @Test func acceptsASignedAppleNotificationAndPrintsItDecoded() async throws {
        let signer = AppleSigner()
        let result = try await inspect(["--store", "apple", "--app", "demo"], body: signer.body(signer.notificationPayload()))
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.output?["accepted"] == true)
        #expect(result.output?["store"] == "apple")
        #expect(result.output?["notification"]?["data"]?["signedTransactionInfo"]?["originalTransactionId"] == "2000000123456789")
        // Normalized statelessly with config/dev.yaml's products: a new subscriber's purchase unlocks `pro`.
        let events = result.output?["events"]?.arrayValue ?? []
        #expect(events.map { $0["type"]?.stringValue } == ["initial_purchase", "subscription_status_did_change"])
        #expect(events.first?["data"]?["price"] == 9.99)
        #expect(events.first?["data"]?["entitlements"] == [["id": "pro", "type": "SERVICE_LEVEL"]])
        #expect(events.last?["data"]?["to"]?["status"] == "ACTIVE")
    }

    @Test func explainsARejectionAndExits65() async throws {
        let body = Array(#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#.utf8)
        let t: Int64 = 1_900_000_000
        let header = "Stripe-Signature: " + WebhookSigning.stripeHeader(body: body, secret: "whsec_dev_only_stripe_secret", timestamp: t)
        let accepted = try await inspect(["--store", "stripe", "--app", "demo", "--header", header, "--now", "\(t)"], body: body)
        #expect(accepted.status == 0, "\(accepted.stderr)")
        let stale = try await inspect(["--store", "stripe", "--app", "demo", "--header", header, "--now", "\(t + 301)"], body: body)
        #expect(stale.status == 65)
        #expect(stale.output?["accepted"] == false)
        #expect(stale.output?["reason"] == "stale_timestamp")
        #expect(stale.output?["detail"]?.stringValue?.isEmpty == false)
        let unknown = try await inspect(["--store", "stripe", "--app", "nobody", "--header", header, "--now", "\(t)"], body: body)
        #expect(unknown.output?["reason"] == "unknown_app")
    }

    @Test func verifiesAGooglePushAndReadsThePlayDeveloperAPI() async throws {
        // A Play Developer API on 127.0.0.1 that knows one purchase token.
        let purchase: JSON = [
            "subscriptionState": "SUBSCRIPTION_STATE_ACTIVE", "startTime": "2030-01-01T00:00:00Z", "regionCode": "DE",
            "lineItems": [[
                "productId": "pro_monthly", "expiryTime": "2030-02-01T00:00:00Z", "offerDetails": ["basePlanId": "monthly"],
                "autoRenewingPlan": ["autoRenewEnabled": true, "recurringPrice": ["currencyCode": "EUR", "units": "4", "nanos": 990000000]],
                "latestSuccessfulOrderId": "GPA.1234-5678-9012-34567",
            ]],
            "externalAccountIdentifiers": ["obfuscatedExternalAccountId": "user-42"],
        ]
        let api = try await TestHTTPServer { request in
            if request.path.hasSuffix("/token") { return TestHTTPResponse(text: #"{"access_token": "t", "expires_in": 3600}"#) }
            guard request.path.hasSuffix("/purchases/subscriptionsv2/tokens/token-abc") else { return TestHTTPResponse(status: 404, text: "{}") }
            return TestHTTPResponse(body: purchase.serialized())
        }
        defer { Task { await api.stop() } }
        let config = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("inspect") + ".yaml")
        try Data(
            """
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                google:
                  packageName: com.example.app
                  pushAudience: "http://127.0.0.1:8080/v1/notifications/google/demo"
                  pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
                  jwks: \(Fixtures.path("google/jwks.json"))
                  playApi: { baseUrl: "\(api.baseURL)", tokenUrl: "\(api.baseURL)/token", serviceAccountKey: \(Fixtures.path("google/service-account.json")) }
                products:
                  - { productId: pro_monthly, store: PLAY_STORE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            """.utf8
        ).write(to: config)

        let now: Int64 = 1_900_000_000
        let claims = GooglePushSigner.claims(issuedAt: now, overrides: ["aud": "http://127.0.0.1:8080/v1/notifications/google/demo"])
        let header = "Authorization: Bearer \(GooglePushSigner().token(claims))"
        let body = GooglePushSigner.envelope(GooglePushSigner.developerNotification())
        let result = try await inspect(["--config", config.path, "--store", "google", "--app", "demo", "--header", header, "--now", "\(now)"], body: body)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.output?["notification"]?["subscriptionNotification"]?["notificationType"] == 4)
        let event = result.output?["events"]?.arrayValue?.first?["data"]
        #expect(result.output?["events"]?.arrayValue?.first?["type"] == "initial_purchase")
        #expect(event?["productId"] == "pro_monthly:monthly")
        #expect(event?["priceInPurchasedCurrency"] == 4.99)
        #expect(event?["currencyCode"] == "EUR")
        #expect(event?["price"] == 5.42)  // 4.99 EUR at 0.92 EUR per USD
        #expect(event?["originalAppUserId"] == "user-42")
        #expect(event?["entitlements"] == [["id": "pro", "type": "SERVICE_LEVEL"]])

        let expired = try await inspect(["--config", config.path, "--store", "google", "--app", "demo", "--header", header, "--now", "\(now + 3661)"], body: body)
        #expect(expired.output?["reason"] == "token_expired")
        // A purchase token the Play Developer API does not know is a reject, with its reason.
        var unknown = GooglePushSigner.developerNotification()
        unknown = .object((unknown.objectValue ?? [:]).merging(["subscriptionNotification": ["notificationType": 4, "purchaseToken": "token-unknown"]]) { $1 })
        let missing = try await inspect(
            ["--config", config.path, "--store", "google", "--app", "demo", "--header", header, "--now", "\(now)"],
            body: GooglePushSigner.envelope(unknown))
        #expect(missing.status == 65)
        #expect(missing.output?["reason"] == "purchase_not_found")
    }

    @Test func badArgumentsExit64AndBadConfigurationExits78() async throws {
        #expect(try await inspect(["--store", "amazon", "--app", "demo"], body: []).status == 64)
        #expect(try await inspect(["--store", "stripe", "--app", "demo", "--header", "no colon here"], body: []).status == 64)
        #expect(try await inspect(["--store", "stripe"], body: []).status == 64)
        let result = try await inspect(["--store", "stripe", "--app", "demo", "--config", "/nonexistent.yaml"], body: [])
        #expect(result.status == 78)
    }
}
