import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Web checkout and redemption codes on a whole relay (embedded log): the SDK's checkout routes against a
/// fake Stripe API over real HTTP that checks every request the relay makes and holds the sessions it
/// creates; Stripe's signed webhooks through the ingest; redemption from the app.
@Suite(.serialized) struct WebCheckoutTests {
    static let publicKey = "pk_checkout_0123456789"
    static let stripeKey = "sk_test_checkout_0123456789"
    static let contextKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  // 32 bytes

    /// Stripe as the relay sees it: prices, the Checkout Sessions it creates (completed by the test, as a
    /// buyer would), their subscriptions, and every request.
    final class FakeStripe: Sendable {
        let sessions = LockedBox<[String: JSON]>([:])
        let subscriptions = LockedBox<[String: JSON]>([:])
        let created = LockedBox<[[String: String]]>([])
        let idempotencyKeys = LockedBox<[String]>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(WebCheckoutTests.stripeKey)", request.headers["stripe-version"] == "2024-06-20" else {
                return TestHTTPResponse(status: 401, text: #"{"error": {"type": "invalid_request_error", "message": "Invalid API Key"}}"#)
            }
            let path = request.path
            switch (request.method, path) {
            case ("GET", "/v1/prices/price_pro_monthly"):
                return Self.reply(["id": "price_pro_monthly", "object": "price", "type": "recurring", "recurring": ["interval": "month"], "unit_amount": 999, "currency": "usd"])
            case ("GET", "/v1/prices/price_lifetime"):
                return Self.reply(["id": "price_lifetime", "object": "price", "type": "one_time", "recurring": nil, "unit_amount": 4999, "currency": "usd"])
            case ("POST", "/v1/checkout/sessions"):
                guard request.headers["content-type"] == "application/x-www-form-urlencoded", let key = request.headers["idempotency-key"] else {
                    return TestHTTPResponse(status: 400, text: #"{"error": {"message": "bad request"}}"#)
                }
                let form = Self.form(request.body)
                var session: [String: JSON] = [
                    "object": "checkout.session", "status": "open", "payment_status": "unpaid", "mode": .string(form["mode"] ?? ""), "livemode": false,
                    "customer": nil, "subscription": nil, "payment_intent": nil, "amount_total": 999, "currency": "usd",
                    "metadata": .object(Self.metadata(form, prefix: "metadata")), "client_reference_id": form["client_reference_id"].map(JSON.string) ?? .null,
                ]
                return idempotencyKeys.withLock { keys in
                    // Stripe answers a repeated key with the first session.
                    if let index = keys.firstIndex(of: key), let existing = sessions.value["cs_test_\(index + 1)"] { return Self.reply(existing) }
                    keys.append(key)
                    let id = "cs_test_\(keys.count)"
                    session["id"] = .string(id)
                    session["url"] = .string("https://checkout.stripe.test/c/pay/\(id)")
                    if form["ui_mode"] == "embedded" { session["client_secret"] = .string("\(id)_secret_x") }
                    sessions.withLock { $0[id] = .object(session) }
                    created.withLock { $0.append(form) }
                    return Self.reply(.object(session))
                }
            default:
                if request.method == "GET", path.hasPrefix("/v1/checkout/sessions/"), let session = sessions.value[String(path.dropFirst("/v1/checkout/sessions/".count))] {
                    return Self.reply(session)
                }
                if request.method == "GET", path.hasPrefix("/v1/subscriptions/"), let subscription = subscriptions.value[String(path.dropFirst("/v1/subscriptions/".count))] {
                    return Self.reply(subscription)
                }
                return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
            }
        }

        /// The buyer pays: the session completes, with its subscription (a subscription-mode session).
        func complete(_ sessionId: String, status: String = "active") -> JSON? {
            guard case .object(var session)? = sessions.value[sessionId] else { return nil }
            let form = created.value[Int(sessionId.dropFirst("cs_test_".count))! - 1]
            let subscriptionId = "sub_\(sessionId.dropFirst("cs_test_".count))WebCheckout"
            let subscription: JSON = [
                "id": .string(subscriptionId), "object": "subscription", "status": .string(status), "customer": "cus_WebBuyer", "livemode": false,
                "start_date": 1_893_456_000, "current_period_start": 1_893_456_000, "current_period_end": 4_000_000_000, "latest_invoice": "in_WebFirst",
                "cancel_at_period_end": false, "metadata": .object(Self.metadata(form, prefix: "subscription_data[metadata]")),
                "items": ["object": "list", "data": [["id": "si_Web", "quantity": 1, "price": [
                    "id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd", "type": "recurring",
                    "recurring": ["interval": "month", "interval_count": 1],
                ]]]],
            ]
            session["status"] = "complete"
            session["payment_status"] = "paid"
            session["customer"] = "cus_WebBuyer"
            session["customer_details"] = ["email": "buyer@example.com"]
            if session["mode"] == "subscription" {
                session["subscription"] = .string(subscriptionId)
                subscriptions.withLock { $0[subscriptionId] = subscription }
            } else {
                session["payment_intent"] = "pi_WebBuyer"
            }
            sessions.withLock { $0[sessionId] = .object(session) }
            return session["mode"] == "subscription" ? subscription : .object(session)
        }

        static func reply(_ object: JSON) -> TestHTTPResponse { TestHTTPResponse(body: object.serialized()) }

        static func form(_ body: [UInt8]) -> [String: String] {
            var form: [String: String] = [:]
            for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
                let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String($0) }
                form[parts[0]] = parts.count > 1 ? parts[1] : ""
            }
            return form
        }

        static func metadata(_ form: [String: String], prefix: String) -> [String: JSON] {
            var metadata: [String: JSON] = [:]
            for (key, value) in form where key.hasPrefix(prefix + "[") && !key.dropFirst(prefix.count + 1).contains("[") {
                metadata[String(key.dropFirst(prefix.count + 1).dropLast())] = .string(value)
            }
            return metadata
        }
    }

    struct Harness {
        let relay: TestRelay
        let backendURL: String
        let stripe: FakeStripe
        let api: TestHTTPServer

        func post(_ path: String, _ body: JSON, key: String? = WebCheckoutTests.publicKey) async throws -> (Int, JSON) {
            var headers = [("Content-Type", "application/json")]
            if let key { headers.append(("Authorization", "Bearer \(key)")) }
            let response = try await relay.http.send("POST", backendURL + "/subscriptions-api/public/v1/" + path, headers: headers, body: body.serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func startCheckout(product: String = "price_pro_monthly", identity: JSON = ["deviceId": "$SuperwallDevice:web-1", "aliasId": "$SuperwallAlias:web-1"]) async throws
            -> (sessionId: String, context: String)
        {
            let (status, answer) = try await post("checkout/session", [
                "currencyCode": "USD", "productIdentifier": .string(product), "store": "stripe",
                "allowedCheckoutDirectives": ["redirect", "drawer", "embedded"],
                "context": ["identity": identity, "paywall": ["paywallUrl": "https://evil.example.com/p"]], "stripeCustomerId": "cus_SomeoneElse",
            ])
            #expect(status == 200, "\(answer)")
            return (answer["directive"]?["checkoutSessionId"]?.stringValue ?? "", answer["checkoutContextId"]?.stringValue ?? "")
        }

        /// The buyer pays, and (unless told) Stripe's signed webhook of it reaches the ingest.
        func pay(_ sessionId: String, status: String = "active", webhook: Bool = true) async throws {
            let object = try #require(stripe.complete(sessionId, status: status))
            guard webhook else { return }
            try await sendWebhook(object, sessionId: sessionId)
        }

        func sendWebhook(_ object: JSON, sessionId: String, type: String? = nil, previous: JSON? = nil) async throws {
            let isSubscription = object["object"] == "subscription"
            var data: [String: JSON] = ["object": object]
            if let previous { data["previous_attributes"] = previous }
            let event: JSON = [
                "id": .string("evt_\(sessionId)\(type.map { "_" + $0 } ?? "")"), "object": "event", "api_version": "2024-06-20",
                "type": .string(type ?? (isSubscription ? "customer.subscription.created" : "checkout.session.completed")),
                "created": .integer(Int64(Date().timeIntervalSince1970) - (type == nil ? 5 : 0)), "livemode": false, "data": .object(data),
            ]
            let body = event.serialized()
            let header = WebhookSigning.stripeHeader(body: body, secret: "whsec_checkout_test", timestamp: Int64(Date().timeIntervalSince1970))
            let response = try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/stripe/demo", headers: [("Content-Type", "application/json"), ("Stripe-Signature", header)], body: body)
            #expect(response.status == 200)
            let subject = isSubscription ? object["id"]?.stringValue ?? "" : "pi_WebBuyer"
            if type == nil { try await waitUntil("the webhook applied") { try await state(subject) != nil } }
        }

        func state(_ id: String) async throws -> SubscriptionState? {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/stripe/\(id)", headers: [("Authorization", "Bearer test-backend-key")])
            guard response.status == 200 else { return nil }
            return try SubscriptionState(json: try JSON.parse(response.body))
        }

        func redeem(_ codes: [String], user: String? = nil, device: String = "$SuperwallDevice:app-1") async throws -> (Int, JSON) {
            var body: [String: JSON] = ["deviceId": .string(device), "codes": .array(codes.map { ["code": .string($0), "firstRedemption": true] })]
            if let user { body["appUserId"] = .string(user) }
            return try await post("redeem", .object(body))
        }

        func entitlements(_ user: String) async throws -> [String] {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/public/v1/users/\(user)/entitlements", headers: [("Authorization", "Bearer \(WebCheckoutTests.publicKey)")])
            return try JSON.parse(response.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
        }

        func events(_ type: String) async throws -> [JSON] {
            try await relay.settledEvents(type)
        }

        func stop() async throws {
            try await relay.stop()
            await api.stop()
        }
    }

    static let otherKey = "pk_checkout_other_0123456789"

    static func start(codeTTL: String = "720h", publishable: Bool = false) async throws -> Harness {
        let stripe = FakeStripe()
        let api = try await TestHTTPServer { request in stripe.answer(request) }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                publicApiKeys: ["\(publicKey)"]
                stripe: { signingSecrets: ["whsec_checkout_test"], api: { secretKey: "\(stripeKey)", baseUrl: "\(api.baseURL)" } }
                web:
                  successUrl: "https://paywall.example.com/success?session={CHECKOUT_SESSION_ID}"
                  redemptionUrl: "exampleapp://superwall/redeem?code={code}"
                  codeTTL: \(codeTTL)
                  contextKeys: [{ id: k1, key: "\(contextKey)" }]\(publishable ? "\n      stripePublishableKey: pk_test_publishable" : "")
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
                  - { productId: price_lifetime, store: STRIPE, entitlements: [lifetime] }
              - key: other
                projectId: 1
                applicationId: 2
                publicApiKeys: ["\(otherKey)"]
                stripe: { signingSecrets: ["whsec_checkout_other"], api: { secretKey: "\(stripeKey)", baseUrl: "\(api.baseURL)" } }
                web:
                  successUrl: "https://other.example.com/ok"
                  redemptionUrl: "otherapp://redeem?code={code}"
                  contextKeys: [{ id: k1, key: "\(contextKey)" }]
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let relay = try await TestRelay(configuration: try AppleRelayConfiguration.parse(text, name: "web-checkout"), log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value(), stripe: stripe, api: api)
    }

    /// A JSON value's shape: member names and kinds of value (an array by its first element's), for
    /// comparing the relay's answers with what Superwall's SDK decodes.
    static func shape(_ value: JSON) -> JSON {
        switch value {
        case .object(let members): .object(members.mapValues(shape))
        case .array(let items): .array(items.first.map { [shape($0)] } ?? [])
        case .string: "string"
        case .null: "null"
        case .bool: "bool"
        default: "number"
        }
    }

    /// One of the SDK's redeem fixtures (Tests/Fixtures/vectors/superwall-ios).
    static func fixture(_ name: String) throws -> JSON {
        try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: Fixtures.path("vectors/superwall-ios/redeem/\(name).json")))))
    }

    static func code(_ url: String?) -> String? {
        url.flatMap { URLComponents(string: $0)?.queryItems?.first { $0.name == "code" }?.value }
    }

    @Test func aWebPurchaseFromCheckoutToTheAppUser() async throws {
        let harness = try await Self.start()
        let (sessionId, context) = try await harness.startCheckout()
        #expect(sessionId == "cs_test_1")
        #expect(context.hasPrefix("v1:k1:"))
        // The request Stripe got: the product's price, the configured URLs, the relay's metadata on the
        // session and its subscription, no user (the buyer is anonymous), an idempotency key.
        let form = try #require(harness.stripe.created.value.first)
        #expect(form["mode"] == "subscription")
        #expect(form["line_items[0][price]"] == "price_pro_monthly")
        #expect(form["line_items[0][quantity]"] == "1")
        #expect(form["success_url"] == "https://paywall.example.com/success?session={CHECKOUT_SESSION_ID}")
        // No cancelUrl configured: none (a client's URL is never put on the merchant's Stripe page), and the
        // client's stripeCustomerId is not used.
        #expect(form["cancel_url"] == nil)
        #expect(form["customer"] == nil)
        #expect(form["metadata[relay_checkout]"]?.count == 32)
        #expect(form["subscription_data[metadata][relay_checkout]"] == form["metadata[relay_checkout]"])
        #expect(form["metadata[app_user_id]"] == nil)
        #expect(harness.stripe.idempotencyKeys.value.count == 1)

        let (status, pending) = try await harness.post("checkout/status", ["checkoutId": .string(context)])
        #expect(status == 200)
        #expect(pending == ["status": "pending", "paymentStatus": "unpaid"])
        let (early, _) = try await harness.post("checkout/session/complete", ["checkoutContextId": .string(context)])
        #expect(early == 409)
        let (polling, polled) = try await harness.post(
            "checkout/session/poll-redemption-result", ["checkoutContextId": .string(context), "deviceId": "$SuperwallDevice:web-1"])
        #expect(polling == 200)
        #expect(polled["status"] == "pending")

        // The buyer pays; Stripe's webhook arrives: an anonymous purchase.
        try await harness.pay(sessionId)
        let (_, completed) = try await harness.post("checkout/status", ["checkoutId": .string(context)])
        #expect(completed["status"] == "completed")
        #expect(completed["paymentStatus"] == "paid")
        let url = try #require(completed["redemptionUrl"]?.stringValue)
        #expect(url.hasPrefix("exampleapp://superwall/redeem?code=redemption_"))
        let (_, complete) = try await harness.post("checkout/session/complete", ["checkoutContextId": .string(context)])
        #expect(complete == ["redemptionUrl": .string(url)])
        let (_, confirm) = try await harness.post("checkout/session/confirm", ["checkoutContextId": .string(context), "setupIntentId": "seti_x", "email": "buyer@example.com"])
        #expect(confirm["customerId"] == "cus_WebBuyer")
        #expect(confirm["subscriptionId"] == "sub_1WebCheckout")
        #expect(confirm["redemptionUrl"] == .string(url))
        let code = try #require(Self.code(url))
        #expect(code.count == "redemption_".count + 32)
        #expect(try await harness.events("initial_purchase").first?["data"]?["originalAppUserId"] == .null)

        // The app redeems it: the purchase is the user's.
        let (redeemed, answer) = try await harness.redeem([code], user: "user-web")
        #expect(redeemed == 200, "\(answer)")
        let result = try #require(answer["codes"]?.arrayValue?.first)
        #expect(result["status"] == "SUCCESS", "\(answer)")
        #expect(result["code"] == .string(code))
        #expect(result["redemptionInfo"]?["ownership"] == ["type": "APP_USER", "appUserId": "user-web"])
        #expect(result["redemptionInfo"]?["purchaserInfo"]?["email"] == "buyer@example.com")
        #expect(result["redemptionInfo"]?["purchaserInfo"]?["storeIdentifiers"] == [
            "store": "STRIPE", "stripeCustomerId": "cus_WebBuyer", "stripeSubscriptionIds": ["sub_1WebCheckout"],
        ])
        #expect(result["redemptionInfo"]?["entitlements"] == [["identifier": "pro", "type": "SERVICE_LEVEL"]])
        #expect(answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        #expect(answer["customerInfo"]?["subscriptions"]?.arrayValue?.first?["store"] == "STRIPE")
        #expect(try await harness.entitlements("user-web") == ["pro"])
        // The shape the SDK decodes: the fixture's, with the seed's top-level entitlements beside it; a
        // device's redemption has the DEVICE ownership of the fixture.
        var fixture = Self.shape(try Self.fixture("redeem_success_stripe"))
        var ours = Self.shape(answer)
        if case .object(var members) = ours { members["entitlements"] = nil; ours = .object(members) }
        if case .object(var members) = fixture, case .array(var codes) = members["codes"] ?? .null, case .object(var first) = codes[0],
            case .object(var info) = first["redemptionInfo"] ?? .null
        {
            info["ownership"] = ["type": "string", "appUserId": "string"]
            first["redemptionInfo"] = .object(info)
            codes[0] = .object(first)
            members["codes"] = .array(codes)
            // The fixture's customer info has only an entitlement; ours the subscription's full entries too.
            members["customerInfo"] = ours["customerInfo"]
            fixture = .object(members)
        }
        #expect(ours == fixture, "\(ours)\n\(fixture)")
        // A receiver learns of it by the status change that names the user; the purchase's earlier events stay.
        let changes = try await harness.events("subscription_status_did_change").filter { $0["data"]?["appUserId"] == "user-web" }
        #expect(changes.count == 1, "\(changes)")
        #expect(changes.first?["data"]?["to"]?["status"] == "ACTIVE")
        #expect(try await harness.events("initial_purchase").count == 1)
        // The purchase's next webhook names the user: the buyer turns auto-renew off.
        guard case .object(var canceled)? = harness.stripe.subscriptions.value["sub_1WebCheckout"] else { Issue.record("no subscription"); return }
        canceled["cancel_at_period_end"] = true
        try await harness.sendWebhook(
            .object(canceled), sessionId: sessionId, type: "customer.subscription.updated", previous: ["cancel_at_period_end": false])
        try await waitUntil("the cancellation") { try await !harness.events("cancellation").isEmpty }
        #expect(try await harness.events("cancellation").first?["data"]?["originalAppUserId"] == "user-web")

        // Again by the same user: the same answer, nothing new. By another user: single use.
        #expect(try await harness.redeem([code], user: "user-web").1["codes"]?.arrayValue?.first?["status"] == "SUCCESS")
        #expect(try await harness.redeem([code], user: "user-other").1["codes"]?.arrayValue?.first?["status"] == "INVALID_CODE")
        #expect(try await harness.entitlements("user-other").isEmpty)
        #expect(try await harness.entitlements("user-web") == ["pro"])
        // The checkout's ids are no way around the code.
        let (handed, refusal) = try await harness.post("users/user-other/purchases", ["store": "STRIPE", "checkoutSessionId": .string(sessionId)])
        #expect(handed == 400)
        #expect(refusal["reason"] == "redeem_with_code")
        try await harness.stop()
    }

    @Test func pollingAfterPaymentRedeemsForTheAppsIdentity() async throws {
        let harness = try await Self.start()
        let (sessionId, context) = try await harness.startCheckout(product: "price_lifetime", identity: ["appUserId": "user-poll", "deviceId": "$SuperwallDevice:p"])
        let form = try #require(harness.stripe.created.value.first)
        #expect(form["mode"] == "payment")
        #expect(form["metadata[app_user_id]"] == "user-poll")
        #expect(form["payment_intent_data[metadata][app_user_id]"] == "user-poll")
        #expect(form["metadata[price_id]"] == "price_lifetime")
        try await harness.pay(sessionId)
        // An identified buyer is named on the purchase: the user has it from the webhook on.
        #expect(try await harness.entitlements("user-poll") == ["lifetime"])
        let (status, answer) = try await harness.post(
            "checkout/session/poll-redemption-result", ["checkoutContextId": .string(context), "appUserId": "user-poll", "deviceId": "$SuperwallDevice:p"])
        #expect(status == 200)
        #expect(answer["status"] == "complete")
        #expect(answer["codes"]?.arrayValue?.first?["status"] == "SUCCESS", "\(answer)")
        #expect(answer["codes"]?.arrayValue?.first?["redemptionInfo"]?["purchaserInfo"]?["storeIdentifiers"]?["stripeSubscriptionIds"] == [])
        #expect(answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["lifetime"])
        // The purchase is the named user's: another user's redemption of its code is refused.
        let code = try #require(Self.code(try await harness.post("checkout/status", ["checkoutId": .string(context)]).1["redemptionUrl"]?.stringValue))
        #expect(try await harness.redeem([code], user: "user-thief").1["codes"]?.arrayValue?.first?["status"] == "INVALID_CODE")
        try await harness.stop()
    }

    @Test func invalidTamperedAndGuessedCodesAndContexts() async throws {
        let harness = try await Self.start()
        let (_, context) = try await harness.startCheckout()
        // A random code, a code of no shape, and a code whose checkout is not paid yet.
        let (status, answer) = try await harness.redeem(["redemption_" + String(repeating: "a", count: 32), "PROMO-CODE"], user: "user-g")
        #expect(status == 200)
        #expect(answer["codes"] == [["status": "INVALID_CODE", "code": .string("redemption_" + String(repeating: "a", count: 32))], ["status": "INVALID_CODE", "code": "PROMO-CODE"]])
        #expect(answer["customerInfo"] == ["subscriptions": [], "nonSubscriptions": [], "entitlements": []])
        #expect(Self.shape(["codes": .array([answer["codes"]!.arrayValue![0]]), "customerInfo": answer["customerInfo"]!]) == Self.shape(try Self.fixture("redeem_invalid_code")))
        // A tampered checkoutContextId: one character changed, or sealed with another key id.
        var tampered = Array(context)
        tampered[tampered.count - 3] = tampered[tampered.count - 3] == "A" ? "B" : "A"
        #expect(try await harness.post("checkout/status", ["checkoutId": .string(String(tampered))]).0 == 400)
        #expect(try await harness.post("checkout/status", ["checkoutId": .string(context.replacingOccurrences(of: "v1:k1:", with: "v1:k2:"))]).0 == 400)
        #expect(try await harness.post("checkout/status", ["checkoutId": "v1:k1:AAAA"]).1["error"] == "invalid_checkout_context")
        // Guessing: 10 codes a client at once, then one every 6 s; the 11th is refused.
        let guesses = (0..<8).map { "redemption_guess\($0)" }
        #expect(try await harness.redeem(guesses, user: "user-g").0 == 200)
        let (limited, refusal) = try await harness.redeem(["redemption_guess9"], user: "user-g")
        #expect(limited == 429, "\(refusal)")
        #expect(refusal["error"] == "rate_limited")
        // No key: 401.
        #expect(try await harness.post("redeem", ["codes": ["x"]], key: nil).0 == 401)
        #expect(try await harness.post("checkout/session", ["productIdentifier": "price_pro_monthly"], key: nil).0 == 401)
        // A product that is not the app's Stripe price; a directive the relay does not offer.
        #expect(try await harness.post("checkout/session", ["productIdentifier": "com.example.pro.monthly"]).1["error"] == "invalid_product")
        #expect(try await harness.post("checkout/session", ["productIdentifier": "price_pro_monthly", "allowedCheckoutDirectives": ["drawer"]]).1["error"] == "unsupported_directive")
        try await harness.stop()
    }

    @Test func anExpiredCodeAndASubscriptionThatHasSinceExpired() async throws {
        let harness = try await Self.start(codeTTL: "300ms")
        // In time: redeemed.
        let (inTime, inTimeContext) = try await harness.startCheckout()
        try await harness.pay(inTime)
        let timely = try #require(Self.code(try await harness.post("checkout/status", ["checkoutId": .string(inTimeContext)]).1["redemptionUrl"]?.stringValue))
        #expect(try await harness.redeem([timely], user: "user-early").1["codes"]?.arrayValue?.first?["status"] == "SUCCESS")
        let (expiredSession, expiredContext) = try await harness.startCheckout()
        try await harness.pay(expiredSession)
        let code = try #require(Self.code(try await harness.post("checkout/status", ["checkoutId": .string(expiredContext)]).1["redemptionUrl"]?.stringValue))
        try await Task.sleep(for: .milliseconds(400))
        let (_, expired) = try await harness.redeem([code], user: "user-late")
        #expect(expired["codes"] == [["status": "CODE_EXPIRED", "code": .string(code), "expired": ["resent": false, "obfuscatedEmail": nil]]])
        #expect(Self.shape(["codes": expired["codes"]!, "customerInfo": expired["customerInfo"]!]) == Self.shape(try Self.fixture("redeem_code_expired")))
        #expect(try await harness.entitlements("user-late").isEmpty)
        try await harness.stop()

        // A code redeemed in time, for a subscription Stripe has ended since.
        let second = try await Self.start()
        let (sessionId, context) = try await second.startCheckout()
        try await second.pay(sessionId, status: "canceled")
        let fresh = try #require(Self.code(try await second.post("checkout/status", ["checkoutId": .string(context)]).1["redemptionUrl"]?.stringValue))
        let (_, answer) = try await second.redeem([fresh], user: "user-gone")
        #expect(answer["codes"]?.arrayValue?.first?["status"] == "EXPIRED_SUBSCRIPTION", "\(answer)")
        #expect(try await second.entitlements("user-gone").isEmpty)
        try await second.stop()
    }

    @Test func redeemedBeforeStripesWebhookAndOnlyOncePaid() async throws {
        let harness = try await Self.start()
        // A bank debit: the session completes unpaid. Not bought yet: pending, no link, nothing to redeem.
        let (slowSession, slowContext) = try await harness.startCheckout()
        harness.stripe.sessions.withLock { sessions in
            if case .object(var session)? = sessions[slowSession] {
                session["status"] = "complete"
                session["payment_status"] = "unpaid"
                sessions[slowSession] = .object(session)
            }
        }
        #expect(try await harness.post("checkout/status", ["checkoutId": .string(slowContext)]).1 == ["status": "pending", "paymentStatus": "unpaid"])
        #expect(try await harness.post("checkout/session/complete", ["checkoutContextId": .string(slowContext)]).0 == 409)
        #expect(try await harness.post("checkout/session/poll-redemption-result", ["checkoutContextId": .string(slowContext), "appUserId": "u"]).1["status"] == "pending")

        // Paid, and redeemed before Stripe's webhook arrives: the worker reads the purchase from Stripe's API.
        let (sessionId, context) = try await harness.startCheckout()
        let subscription = try #require(harness.stripe.complete(sessionId))
        let code = try #require(Self.code(try await harness.post("checkout/session/complete", ["checkoutContextId": .string(context)]).1["redemptionUrl"]?.stringValue))
        let (_, answer) = try await harness.redeem([code], user: "user-early-bird")
        #expect(answer["codes"]?.arrayValue?.first?["status"] == "SUCCESS", "\(answer)")
        #expect(try await harness.entitlements("user-early-bird") == ["pro"])
        // Then the webhook: the same purchase, counted once.
        try await harness.sendWebhook(subscription, sessionId: sessionId)
        try await waitUntil("the webhook applied") { try await harness.state("sub_2WebCheckout")?.recentNotifications.count == 2 }
        #expect(try await harness.events("initial_purchase").count == 1)
        #expect(try await harness.entitlements("user-early-bird") == ["pro"])

        // Another app's key reaches neither this app's checkout nor its codes.
        #expect(try await harness.post("checkout/status", ["checkoutId": .string(context)], key: Self.otherKey).1["error"] == "invalid_checkout_context")
        #expect(try await harness.post("redeem", ["appUserId": "user-early-bird", "codes": [["code": .string(code)]]], key: Self.otherKey).1["codes"]?
            .arrayValue?.first?["status"] == "INVALID_CODE")
        // Support, with the secret key, may hand a checkout's purchase to a buyer whose code was lost.
        let (sessionThree, _) = try await harness.startCheckout()
        try await harness.pay(sessionThree)
        let support = try await harness.relay.http.send(
            "POST", harness.backendURL + "/subscriptions-api/public/v1/users/user-support/purchases?applicationId=1",
            headers: [("Authorization", "Bearer test-backend-key"), ("Content-Type", "application/json")],
            body: JSON.object(["store": "STRIPE", "checkoutSessionId": .string(sessionThree)]).serialized())
        #expect(support.status == 200, "\(String(decoding: support.body, as: UTF8.self))")
        #expect(try await harness.entitlements("user-support") == ["pro"])
        try await harness.stop()
    }

    @Test func anEmbeddedCheckoutWhenThePublishableKeyIsConfigured() async throws {
        let harness = try await Self.start(publishable: true)
        let (status, answer) = try await harness.post("checkout/session", [
            "productIdentifier": "price_pro_monthly", "allowedCheckoutDirectives": ["drawer", "embedded", "redirect"],
            "context": ["identity": ["deviceId": "$SuperwallDevice:e"]],
        ])
        #expect(status == 200, "\(answer)")
        #expect(answer["directive"]?["directive"] == "embedded")
        #expect(answer["directive"]?["publishableKey"] == "pk_test_publishable")
        #expect(answer["directive"]?["clientSecret"] == "cs_test_1_secret_x")
        let form = try #require(harness.stripe.created.value.first)
        #expect(form["ui_mode"] == "embedded")
        #expect(form["return_url"] == "https://paywall.example.com/success?session={CHECKOUT_SESSION_ID}")
        #expect(form["success_url"] == nil)
        try await harness.stop()
    }
}
