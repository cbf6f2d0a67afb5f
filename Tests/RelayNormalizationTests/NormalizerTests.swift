import CoreMetrics
import Foundation
import RelayBackend
import RelayConfig
import RelayCore
@testable import RelayNormalization
import RelayTestSupport
import RelayVerification
import Testing

/// The normalizer's behaviour around the mapping tables: concurrency, failures, what it rejects.
@Suite struct NormalizerTests {
    /// A Stripe subscription event, verified, for `subscription` at `created` (Unix seconds).
    func stripeEvent(
        _ id: String, subscription: String = "sub_n", status: String = "active", cancelAtPeriodEnd: Bool = false, created: Int64, user: String = "user-n"
    ) -> VerifiedNotification {
        let object: JSON = [
            "id": .string(subscription), "object": "subscription", "customer": "cus_n", "status": .string(status),
            "start_date": .integer(created), "current_period_end": .integer(created + 2_592_000), "cancel_at_period_end": .bool(cancelAtPeriodEnd),
            "metadata": ["app_user_id": .string(user)],
            "items": ["data": [["quantity": 1, "price": ["id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd"]]]],
        ]
        let event: JSON = [
            "id": .string(id), "object": "event", "type": "customer.subscription.updated", "created": .integer(created), "livemode": false,
            "data": ["object": object, "previous_attributes": ["cancel_at_period_end": .bool(!cancelAtPeriodEnd)]],
        ]
        return VerifiedNotification(store: .stripe, app: "demo", payload: event, notificationId: id, type: "customer.subscription.updated")
    }

    @Test func concurrentNotificationsOfOneSubscriptionAreAllApplied() async throws {
        let harness = try await ScenarioHarness()
        // Two workers racing on one subscription (as after a rebalance): If-Match makes the loser re-read.
        async let first = harness.normalizer.normalize(stripeEvent("evt_a", cancelAtPeriodEnd: true, created: 1_893_456_000), receivedAt: 1_893_456_001_000)
        async let second = harness.normalizer.normalize(stripeEvent("evt_b", cancelAtPeriodEnd: true, created: 1_893_456_000), receivedAt: 1_893_456_001_000)
        let events = try await [first, second]
        #expect(events.allSatisfy { !$0.isEmpty })
        let stored = try #require(try await harness.client.subscription(store: .stripe, originalTransactionId: "sub_n"))
        #expect(Set(stored.recentNotifications.map(\.id)) == ["evt_a", "evt_b"])
        #expect(stored.version == 2)
        await harness.stop()
    }

    @Test func theAppliedNotificationsAreBounded() async throws {
        let harness = try await ScenarioHarness()
        for index in 0..<20 {
            let time = Int64(1_893_456_000 + index)
            _ = try await harness.normalizer.normalize(
                stripeEvent("evt_\(index)", cancelAtPeriodEnd: index % 2 == 0, created: time), receivedAt: time * 1000 + 1000)
        }
        let stored = try #require(try await harness.client.subscription(store: .stripe, originalTransactionId: "sub_n"))
        #expect(stored.recentNotifications.count == NotificationMapping.recentNotificationLimit)
        #expect(stored.recentNotifications.last?.id == "evt_19")
        await harness.stop()
    }

    @Test func anUnreachableBackendIsRetriedNotRejected() async throws {
        let harness = try await ScenarioHarness()
        await harness.stop()  // the backend is gone
        await #expect {
            _ = try await harness.normalizer.normalize(stripeEvent("evt_down", created: 1_893_456_000), receivedAt: 1_893_456_001_000)
        } throws: { error in
            guard case .unavailable = error as? NormalizationError else { return false }
            return true
        }
    }

    @Test func hostileNumbersInASignedEventNeverTrapTheWorker() async throws {
        // A validly signed event can carry any integer: products and seconds→milliseconds must not overflow.
        let object: JSON = [
            "id": "sub_hostile", "object": "subscription", "customer": "cus_h", "status": "active", "start_date": .integer(Int64.max),
            "current_period_end": .integer(9_300_000_000_000_000), "trial_end": .integer(Int64.min), "cancel_at_period_end": false,
            "discount": ["coupon": ["id": "c", "percent_off": 1e300]],
            "items": ["data": [["quantity": .integer(Int64.max), "price": ["id": "price_pro_monthly", "unit_amount": .integer(Int64.max), "currency": "usd"]]]],
        ]
        let event: JSON = [
            "id": "evt_hostile", "object": "event", "type": "customer.subscription.created", "created": .integer(9_300_000_000_000_000),
            "livemode": false, "data": ["object": object],
        ]
        let notification = VerifiedNotification(store: .stripe, app: "demo", payload: event, notificationId: "evt_hostile", type: "customer.subscription.created")
        let normalizer = try SubscriptionUpdater(
            configuration: try Fixtures.configuration(), stateStore: StatelessStateStore(configuration: try Fixtures.configuration()), storeAPIs: try testStoreAPIs(try Fixtures.configuration()),
            logger: testLogger(), metrics: NOOPMetricsHandler.instance)
        let events = try await normalizer.normalize(notification, receivedAt: 1_893_456_001_000)
        #expect(events.first?.type == .initialPurchase)
        #expect(events.first?.payload.data.storeEvent?.ts == 1_893_456_001_000)  // `created` out of range: the receive time
        #expect(events.first?.payload.json["data"]?["expirationAt"] == .null)
    }

    func googleNotification(token: String = "token-n") -> VerifiedNotification {
        let notification: JSON = [
            "version": "1.0", "packageName": "com.example.app", "eventTimeMillis": "1893456000000",
            "subscriptionNotification": ["version": "1.0", "notificationType": 2, "purchaseToken": .string(token), "subscriptionId": "pro_monthly"],
        ]
        return VerifiedNotification(store: .google, app: "demo", payload: notification, notificationId: "m-1", type: "SUBSCRIPTION_RENEWED")
    }

    /// The backend, through which every write of one subscription fails once: a worker that crashed
    /// between a plan change's two writes (the new token's state, then the old token's mark).
    final class FailingOnce: SubscriptionStateStore {
        let inner: any SubscriptionStateStore
        let subject: String
        let failed = LockedBox(false)
        init(_ inner: any SubscriptionStateStore, failingWriteOf subject: String) {
            self.inner = inner
            self.subject = subject
        }
        func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping { try await inner.productMapping(applicationId: applicationId) }
        func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
            try await inner.subscription(store: store, originalTransactionId: originalTransactionId)
        }
        func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
            if state.originalTransactionId == subject {
                let first = failed.withLock { wasFailed -> Bool in
                    defer { wasFailed = true }
                    return !wasFailed
                }
                if first { throw BackendError(kind: .unavailable, message: "test: the process died here") }
            }
            return try await inner.write(state, ifMatch: ifMatch)
        }
        func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
            async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
        {
            try await inner.appUserAndOtherActiveSubscriptions(id, applicationId: applicationId, excluding: store, originalTransactionId: originalTransactionId)
        }
    }

    /// A purchase made under an alias the app linked to a user counts the user's other subscriptions (made
    /// under the user's own id) in its events' `subscriptionStatus`, as the entitlements route does.
    @Test func aPurchaseUnderALinkedAliasCountsTheUsersOtherSubscriptions() async throws {
        let harness = try await ScenarioHarness(transport: .inProcess)
        let signed = Fixtures.signedDate
        try await harness.store(
            SubscriptionState(
                store: .apple, originalTransactionId: "4000", applicationId: 1, originalAppUserId: "user-x", appUserIds: ["user-x"],
                productId: "com.example.lifetime", status: .active, expiresAt: nil, environment: "PRODUCTION", sourceTimestamp: 1))
        func status(_ events: [StandardEvent]) -> [String] {
            (events.first?.payload.json["data"]?["subscriptionStatus"]?["entitlements"]?.arrayValue ?? []).compactMap { $0["id"]?.stringValue }.sorted()
        }
        // Not linked: the alias's purchase stands alone.
        let alone = try await harness.normalizer.normalize(
            stripeEvent("evt_alias_1", subscription: "sub_alias_1", created: signed / 1000, user: "$SuperwallAlias:Q1"), receivedAt: signed)
        #expect(status(alone) == ["pro"])
        // Linked: the user's lifetime purchase counts too.
        try await harness.link(["$SuperwallAlias:Q2"], to: "user-x")
        try await harness.setAttributes(["plan": "team", "seats": 5], of: "user-x")
        let linked = try await harness.normalizer.normalize(
            stripeEvent("evt_alias_2", subscription: "sub_alias_2", created: signed / 1000, user: "$SuperwallAlias:Q2"), receivedAt: signed)
        #expect(status(linked) == ["lifetime", "pro"])
        // The status change names the user, not the alias the store carried; the store event keeps the store's id.
        func changed(_ events: [StandardEvent]) -> JSON? { events.first { $0.type == .subscriptionStatusDidChange }?.payload.json["data"] }
        #expect(changed(alone)?["appUserId"] == "$SuperwallAlias:Q1")
        #expect(changed(linked)?["appUserId"] == "user-x")
        #expect(linked.first?.payload.json["data"]?["originalAppUserId"] == "$SuperwallAlias:Q2")
        // Every event carries the user's attributes and ids; an unknown user's carry none (the shape receivers know).
        for event in linked {
            #expect(event.payload.json["data"]?["userAttributes"] == ["plan": "team", "seats": 5], "\(event.type)")
            #expect(event.payload.json["data"]?["aliases"] == ["$SuperwallAlias:Q2"], "\(event.type)")
        }
        #expect(alone.allSatisfy { $0.payload.json["data"]?["userAttributes"] == nil && $0.payload.json["data"]?["aliases"] == nil })
        // A redelivery yields the same events: the user is what was recorded when it was applied.
        let again = try await harness.normalizer.normalize(
            stripeEvent("evt_alias_2", subscription: "sub_alias_2", created: signed / 1000, user: "$SuperwallAlias:Q2"), receivedAt: signed)
        #expect(again.map(\.body) == linked.map(\.body))
        await harness.stop()
    }

    /// A store's user id with a control character is a user of its own, over HTTP and in process alike. The
    /// backend's routes refuse such an id (GRDB would end it at a NUL and name another user), so a worker whose
    /// backend is elsewhere never asks for it and does not retry its notification forever; in process it does
    /// not read the user the NUL would cut it to either.
    @Test(arguments: [ScenarioHarness.Transport.http, .inProcess])
    func aStoresUserIdWithAControlCharacterIsAUserOfItsOwn(_ transport: ScenarioHarness.Transport) async throws {
        let harness = try await ScenarioHarness(transport: transport)
        let signed = Fixtures.signedDate
        // `user` has a lifetime purchase and attributes: neither is the ids' below.
        try await harness.store(
            SubscriptionState(
                store: .apple, originalTransactionId: "4100", applicationId: 1, originalAppUserId: "user", appUserIds: ["user"],
                productId: "com.example.lifetime", status: .active, expiresAt: nil, environment: "PRODUCTION", sourceTimestamp: 1))
        try await harness.setAttributes(["plan": "team"], of: "user")
        for (index, id) in ["user\u{0}x", "user\nx", "user\u{85}"].enumerated() {
            let events = try await harness.normalizer.normalize(
                stripeEvent("evt_control_\(index)", subscription: "sub_control_\(index)", created: signed / 1000, user: id), receivedAt: signed)
            let data = events.first { $0.type == .subscriptionStatusDidChange }?.payload.json["data"]
            #expect(data?["appUserId"]?.stringValue == id, "\(id.debugDescription)")
            let entitlements = (data?["subscriptionStatus"]?["entitlements"]?.arrayValue ?? []).compactMap { $0["id"]?.stringValue }
            #expect(entitlements == ["pro"], "\(id.debugDescription): \(entitlements)")
            #expect(events.allSatisfy { $0.payload.json["data"]?["userAttributes"] == nil }, "\(id.debugDescription)")
            #expect(try await harness.subscription(store: .stripe, originalTransactionId: "sub_control_\(index)")?.originalAppUserId == id)
        }
        await harness.stop()
    }

    /// The local store reads the likely user with the state (one read, `subscriptionReadingAhead`): what it reads
    /// ahead is what the separate read answers, for an alias, for the stored state's user, and for nobody.
    @Test func theUserReadAheadWithTheStateIsWhatTheSeparateReadFinds() async throws {
        let harness = try await ScenarioHarness(transport: .inProcess)
        func state(_ id: String, user: String?, product: String = "com.example.pro.monthly", status: SubscriptionState.Status = .active) -> SubscriptionState {
            SubscriptionState(
                store: .apple, originalTransactionId: id, applicationId: 1, originalAppUserId: user, appUserIds: user.map { [$0] } ?? [],
                productId: product, status: status, expiresAt: status == .active ? nil : 1_000, environment: "PRODUCTION", sourceTimestamp: 1)
        }
        try await harness.store(state("5000", user: "user-y"))
        try await harness.store(state("5001", user: "user-y", product: "com.example.lifetime"))
        try await harness.store(state("5003", user: "user-y", status: .expired))
        try await harness.store(state("5002", user: nil))
        try await harness.store(state("5100", user: "user-z", product: "com.example.lifetime"))
        try await harness.link(["$SuperwallAlias:R"], to: "user-y")
        try await harness.setAttributes(["plan": "team"], of: "user-y")
        try await harness.setAttributes(["plan": "solo"], of: "user-z")
        let store = harness.stateStore
        // (likely user, the id read ahead, the user it stands for, its attributes, its other active subscriptions)
        let cases: [(String?, String, String, JSON, [String])] = [
            ("$SuperwallAlias:R", "$SuperwallAlias:R", "user-y", ["plan": "team"], ["5001"]),  // an alias of the stored user
            (nil, "user-y", "user-y", ["plan": "team"], ["5001"]),  // the stored state's user; its expired one left out
            ("user-z", "user-z", "user-z", ["plan": "solo"], ["5100"]),  // another user than the stored one, without aliases
        ]
        for (likely, id, user, attributes, active) in cases {
            let (current, ahead) = try await store.subscriptionReadingAhead(store: .apple, originalTransactionId: "5000", likelyUser: likely, applicationId: 1)
            #expect(current?.originalTransactionId == "5000")
            let read = try #require(ahead, "nothing read ahead for \(likely ?? "the stored user")")
            #expect(read.id == id)
            #expect(read.user.appUserId == user && .object(read.user.attributes) == attributes, "\(read.user)")
            #expect(read.active.map(\.originalTransactionId) == active, "\(id)")
            let separate = try await store.appUserAndOtherActiveSubscriptions(id, applicationId: 1, excluding: .apple, originalTransactionId: "5000")
            #expect(read.user == separate.user)
            #expect(read.active.map(\.originalTransactionId) == separate.active.map(\.originalTransactionId))
        }
        // An anonymous subscription and an unknown one: nobody to read ahead.
        #expect(try await store.subscriptionReadingAhead(store: .apple, originalTransactionId: "5002", likelyUser: nil, applicationId: 1).user == nil)
        let unknown = try await store.subscriptionReadingAhead(store: .apple, originalTransactionId: "5999", likelyUser: nil, applicationId: 1)
        #expect(unknown.state == nil && unknown.user == nil)
        await harness.stop()
    }

    /// Events are counted (`relay_events_total`) once, when they are the answer: a write that fails and
    /// is tried again (a backend outage, a lost If-Match race) counts nothing twice.
    @Test func eventsAreCountedOnceAcrossAFailedWriteAndItsRetry() async throws {
        let harness = try await ScenarioHarness(transport: .inProcess)
        let metrics = TestMetrics()
        let updater = try SubscriptionUpdater(
            configuration: harness.configuration, stateStore: FailingOnce(harness.stateStore, failingWriteOf: "sub_counted"), storeAPIs: StoreAPIs(),
            logger: testLogger(), metrics: metrics)
        let created = Fixtures.signedDate / 1000
        let notification = stripeEvent("evt_counted", subscription: "sub_counted", created: created)
        await #expect(throws: NormalizationError.self) { try await updater.normalize(notification, receivedAt: Fixtures.signedDate) }
        let events = try await updater.normalize(notification, receivedAt: Fixtures.signedDate)
        #expect(!events.isEmpty)
        let counted = events.map(\.type.rawValue).reduce(into: [String: Int64]()) { $0[$1, default: 0] += 1 }
        for (type, count) in counted {
            #expect(metrics.value(of: "relay_events_total", ["stripe", type]) == count, "\(type)")
        }
        await harness.stop()
    }

    /// A crash between the new token's write and the old token's mark: the redelivered notification
    /// finds itself applied (its recorded context) and marks the old token then, with the same events.
    @Test func aPlanChangeRedeliveredAfterACrashMarksTheReplacedTokenThen() async throws {
        let harness = try await ScenarioHarness()
        let line: JSON = [
            "productId": "pro_monthly", "offerDetails": ["basePlanId": "monthly"], "offerPhase": ["basePrice": [:]], "expiryTime": "2030-01-31T00:00:00.000Z",
            "latestSuccessfulOrderId": "GPA.9900-1", "autoRenewingPlan": ["autoRenewEnabled": true, "recurringPrice": ["currencyCode": "USD", "units": "9", "nanos": 990_000_000]],
        ]
        func purchase(_ linked: String?) -> JSON {
            var document: JSON = [
                "kind": "androidpublisher#subscriptionPurchaseV2", "regionCode": "US", "startTime": "2030-01-01T00:00:00.000Z",
                "subscriptionState": "SUBSCRIPTION_STATE_ACTIVE", "externalAccountIdentifiers": ["obfuscatedExternalAccountId": "user-crash"],
                "lineItems": [line],
            ]
            if let linked { document = deepMerge(document, ["linkedPurchaseToken": .string(linked)]) }
            return document
        }
        func purchased(_ token: String, message: String) -> VerifiedNotification {
            let notification: JSON = [
                "version": "1.0", "packageName": "com.example.app", "eventTimeMillis": "1893456000000",
                "subscriptionNotification": ["version": "1.0", "notificationType": 4, "purchaseToken": .string(token), "subscriptionId": "pro_monthly"],
            ]
            return VerifiedNotification(store: .google, app: "demo", payload: notification, notificationId: message, type: "SUBSCRIPTION_PURCHASED")
        }
        harness.play.withLock { $0 = ["subscription": purchase(nil)] }
        _ = try await harness.normalizer.normalize(purchased("token-crash-old", message: "m-old"), receivedAt: 1_893_456_001_000)

        harness.play.withLock { $0 = ["subscription": purchase("token-crash-old")] }
        let crashing = try SubscriptionUpdater(
            configuration: harness.configuration, stateStore: FailingOnce(BackendStateStore(client: harness.client), failingWriteOf: "token-crash-old"),
            storeAPIs: try testStoreAPIs(harness.configuration), logger: testLogger(), metrics: NOOPMetricsHandler.instance)
        do {
            _ = try await crashing.normalize(purchased("token-crash-new", message: "m-new"), receivedAt: 1_893_456_002_000)
            Issue.record("the mark's write failed: the record must be retried")
        } catch {
            guard case .unavailable = error else { Issue.record("\(error)"); return }
        }
        #expect(try await harness.client.subscription(store: .google, originalTransactionId: "token-crash-new") != nil)
        #expect(try await harness.client.subscription(store: .google, originalTransactionId: "token-crash-old")?.replacedBy == nil)

        // Redelivered (another worker, or this one after the restart).
        let events = try await harness.normalizer.normalize(purchased("token-crash-new", message: "m-new"), receivedAt: 1_893_456_002_000)
        #expect(try await harness.client.subscription(store: .google, originalTransactionId: "token-crash-old")?.replacedBy == "token-crash-new")
        #expect(events.map(\.id).contains("google:m-new:initial_purchase"))
        await harness.stop()
    }

    /// A voided order of the new token reads the subscription as any notification does, with the same
    /// replacement rule: a DEFERRED plan change leaves the old token its access (it ends at the renewal).
    @Test func aVoidedOrderOfADeferredPlanChangeLeavesTheOldTokenItsAccess() async throws {
        let harness = try await ScenarioHarness(transport: .inProcess)
        func purchase(linked: String?, deferred: Bool) -> JSON {
            var line: JSON = [
                "productId": "pro_monthly", "offerDetails": ["basePlanId": "monthly"], "expiryTime": "2030-01-31T00:00:00.000Z",
                "latestSuccessfulOrderId": "GPA.7700-1", "autoRenewingPlan": ["autoRenewEnabled": true],
            ]
            if deferred {
                line = deepMerge(line, ["itemReplacement": ["productId": "pro_monthly", "basePlanId": "yearly", "replacementMode": "DEFERRED"]])
            }
            var document: JSON = [
                "kind": "androidpublisher#subscriptionPurchaseV2", "regionCode": "US", "startTime": "2030-01-01T00:00:00.000Z",
                "subscriptionState": "SUBSCRIPTION_STATE_ACTIVE", "externalAccountIdentifiers": ["obfuscatedExternalAccountId": "user-deferred"],
                "lineItems": [line],
            ]
            if let linked { document = deepMerge(document, ["linkedPurchaseToken": .string(linked)]) }
            return document
        }
        let purchased: JSON = [
            "version": "1.0", "packageName": "com.example.app", "eventTimeMillis": "1893456000000",
            "subscriptionNotification": ["version": "1.0", "notificationType": 4, "purchaseToken": "token-deferred-old", "subscriptionId": "pro_monthly"],
        ]
        harness.play.withLock { $0 = ["subscription": purchase(linked: nil, deferred: false)] }
        _ = try await harness.normalizer.normalize(
            VerifiedNotification(store: .google, app: "demo", payload: purchased, notificationId: "m-d1", type: "SUBSCRIPTION_PURCHASED"),
            receivedAt: 1_893_456_001_000)
        let voided: JSON = [
            "version": "1.0", "packageName": "com.example.app", "eventTimeMillis": "1893456100000",
            "voidedPurchaseNotification": ["purchaseToken": "token-deferred-new", "orderId": "GPA.7700-9", "productType": 1, "refundType": 1],
        ]
        harness.play.withLock { $0 = ["subscription": purchase(linked: "token-deferred-old", deferred: true)] }
        _ = try await harness.normalizer.normalize(
            VerifiedNotification(store: .google, app: "demo", payload: voided, notificationId: "m-d2", type: "VOIDED_PURCHASE"),
            receivedAt: 1_893_456_101_000)
        let old = try #require(try await harness.subscription(store: .google, originalTransactionId: "token-deferred-old"))
        #expect(old.replacedBy == nil, "a DEFERRED change keeps the old token until its renewal")
        await harness.stop()
    }

    @Test func playAPIFailuresAreRetriedOrRejectedByKind() async throws {
        let harness = try await ScenarioHarness()
        harness.play.withLock { $0 = ["$status": 503] }
        do {
            _ = try await harness.normalizer.normalize(googleNotification(), receivedAt: 1_893_456_001_000)
            Issue.record("a Play API answering 503 must not yield events")
        } catch {
            guard case .unavailable = error else { Issue.record("503: \(error)"); return }
        }
        // Refused (credentials, Play Console permissions): retried until fixed, never rejected, so the
        // purchase keeps its place in its subscription's history.
        harness.play.withLock { $0 = ["$status": 403] }
        do {
            _ = try await harness.normalizer.normalize(googleNotification(), receivedAt: 1_893_456_001_000)
            Issue.record("a Play API answering 403 must not yield events")
        } catch {
            guard case .unavailable = error else { Issue.record("403: \(error)"); return }
        }
        harness.play.withLock { $0 = .null }
        do {
            _ = try await harness.normalizer.normalize(googleNotification(), receivedAt: 1_893_456_001_000)
            Issue.record("an unknown purchase token must not yield events")
        } catch {
            guard case .rejected(let rejection) = error else { Issue.record("404: \(error)"); return }
            #expect(rejection.reason == .purchaseNotFound)
        }
        await harness.stop()
    }

    @Test func anAuthenticAppleTransactionWithoutItsKeysIsRejectedNotDropped() async throws {
        let configuration = try Fixtures.configuration()
        let normalizer = try SubscriptionUpdater(
            configuration: configuration, stateStore: StatelessStateStore(configuration: configuration), storeAPIs: try testStoreAPIs(configuration), logger: testLogger(),
            metrics: NOOPMetricsHandler.instance)
        for (originalTransactionId, productId, missing) in [("", "com.example.pro.monthly", "originalTransactionId"), ("1000", "", "productId")] {
            let payload: JSON = [
                "notificationType": "DID_RENEW", "notificationUUID": "u-empty", "signedDate": 1_893_456_000_000,
                "data": [
                    "bundleId": "com.example.app", "environment": "Sandbox",
                    "signedTransactionInfo": [
                        "originalTransactionId": .string(originalTransactionId), "transactionId": "2000", "productId": .string(productId),
                        "bundleId": "com.example.app", "purchaseDate": 1_893_456_000_000, "expiresDate": 1_896_134_400_000,
                        "type": "Auto-Renewable Subscription", "environment": "Sandbox",
                    ],
                ],
            ]
            let notification = VerifiedNotification(store: .apple, app: "demo", payload: payload, notificationId: "u-empty", type: "DID_RENEW")
            do {
                let events = try await normalizer.normalize(notification, receivedAt: 1_893_456_001_000)
                Issue.record("a transaction without \(missing) yielded \(events.count) events instead of a reject")
            } catch {
                guard case .rejected(let rejection) = error else { Issue.record("\(error)"); return }
                #expect(rejection.reason == .malformed)
                #expect(rejection.detail.contains(missing))
            }
        }
    }

    @Test func aGoogleAppWithoutPlayAPIRejectsWithAReasonThatSaysSo() async throws {
        let configuration = try Fixtures.configuration()  // its Google app has no playApi
        let normalizer = try SubscriptionUpdater(
            configuration: configuration, stateStore: StatelessStateStore(configuration: configuration), storeAPIs: try testStoreAPIs(configuration), logger: testLogger(),
            metrics: NOOPMetricsHandler.instance)
        do {
            _ = try await normalizer.normalize(googleNotification(), receivedAt: 1_893_456_001_000)
            Issue.record("expected a reject")
        } catch {
            guard case .rejected(let rejection) = error else { Issue.record("\(error)"); return }
            #expect(rejection.reason == .storeAPIRejected)
            #expect(rejection.detail.contains("playApi"))
        }
    }
}

/// The configurations the repository ships build a normalizer: exchange rates and Play API keys load.
@Suite struct ShippedNormalizerConfigurationTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func devAndExampleConfigurationsBuildANormalizer() throws {
        for (file, environment) in [
            ("config/dev.yaml", [:]),
            (
                "config/example.yaml",
                [
                    "RELAY_BACKEND_KEY": "k", "ANALYTICS_READ_KEY": "r", "DEMO_PUBLIC_API_KEY": "p", "STRIPE_WEBHOOK_SECRET": "whsec_s", "PADDLE_WEBHOOK_SECRET": "p", "ANALYTICS_WHSEC": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                    "GOOGLE_SERVICE_ACCOUNT_KEY_FILE": Fixtures.path("google/service-account.json"),
                ]
            ),
        ] {
            let configuration = try RelayConfiguration.load(path: Self.root.appendingPathComponent(file).path, environment: environment)
            #expect(configuration.money.exchangeRates != nil, "\(file) names no exchange rates")
            _ = try SubscriptionUpdater(
                configuration: configuration, stateStore: StatelessStateStore(configuration: configuration), storeAPIs: try testStoreAPIs(configuration), logger: testLogger(),
                metrics: NOOPMetricsHandler.instance)
        }
    }
}
