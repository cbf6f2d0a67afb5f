import Foundation
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The overview's metrics (`EventStore.metrics`, `GET .../metrics`) on fixture events whose answers are
/// computed by hand below: monthly and annual periods, a purchase in euros, a refund, a trial that converts
/// and one that does not, an upgrade, and an end.
@Suite struct EventMetricsTests {
    static let day: Int64 = 86_400_000
    static let hour: Int64 = 3_600_000
    /// 2026-01-01T00:00:00Z.
    static let d0: Int64 = 1_767_225_600_000

    /// A standardized event of app `demo` with its period and money.
    static func event(
        _ id: String, _ type: EventType, subject: String, transaction: String, at: Int64, period: Int64? = nil, price: Double?,
        periodType: SubscriptionState.PeriodType = .normal, trialConversion: Bool = false, refund: Bool = false, currency: String = "USD",
        local: Double? = nil, product: String = "pro_monthly", store: Store = .apple
    ) -> [UInt8] {
        let data = StoreEventData(
            id: id, name: type, cancelReason: refund ? .customerSupport : nil, expirationReason: type == .expiration ? .unsubscribe : nil,
            exchangeRate: price == nil ? nil : 1, isSmallBusiness: false, periodType: periodType, countryCode: "US", price: price, proceeds: price,
            priceInPurchasedCurrency: local ?? price, currencyCode: currency, taxPercentage: nil, commissionPercentage: 0.15, takehomePercentage: 0.85,
            offerCode: nil, isFamilyShare: false, expirationAt: period.map { at + $0 }, transactionId: transaction, originalTransactionId: subject,
            originalAppUserId: "user-\(subject)", store: store == .apple ? "APP_STORE" : "STRIPE", purchasedAt: at, productId: product, environment: "PRODUCTION",
            isTrialConversion: trialConversion, newProductId: nil, bundleId: nil, ts: at, sdkEvents: [], entitlements: [],
            subscriptionStatus: SubscriptionStatus(entitlements: ["pro"]), gracePeriodExpiresAt: nil,
            source: EventSource(store: store, notificationId: id, type: "TEST", subtype: nil))
        return WireCoding.encode(EventPayload(type: type, projectId: 1, applicationId: 7, timestamp: at, data: .store(data)))
    }

    static func fixture() -> [EventStore.Entry] {
        let d0 = Self.d0, day = Self.day, hour = Self.hour
        return [
            // A: monthly (30 days) at 9.99, ends on day 30.
            event("a1", .initialPurchase, subject: "A", transaction: "a1", at: d0 + hour, period: 30 * day, price: 9.99),
            event("a2", .expiration, subject: "A", transaction: "a1", at: d0 + hour + 30 * day, price: nil),
            // B: annual at 120.
            event("b1", .initialPurchase, subject: "B", transaction: "b1", at: d0 + 2 * hour, period: 365 * day, price: 120, product: "pro_annual"),
            // C: a 7-day trial that converts to monthly at 4.99.
            event("c1", .initialPurchase, subject: "C", transaction: "c1", at: d0 + 3 * hour, period: 7 * day, price: 0, periodType: .trial),
            event("c2", .renewal, subject: "C", transaction: "c2", at: d0 + 3 * hour + 7 * day, period: 30 * day, price: 4.99, trialConversion: true),
            // D: a 7-day trial that does not convert.
            event("d1", .initialPurchase, subject: "D", transaction: "d1", at: d0 + 4 * hour, period: 7 * day, price: 0, periodType: .trial),
            event("d2", .expiration, subject: "D", transaction: "d1", at: d0 + 4 * hour + 7 * day, price: nil, periodType: .trial),
            // E: monthly bought in euros (9.99 EUR, 10.79 USD), refunded on day 1.
            event("e1", .initialPurchase, subject: "E", transaction: "e1", at: d0 + 5 * hour, period: 30 * day, price: 10.79, currency: "EUR", local: 9.99),
            event("e2", .cancellation, subject: "E", transaction: "e1", at: d0 + day + 6 * hour, price: -10.79, refund: true, currency: "EUR", local: -9.99),
            // F: monthly at 9.99, upgraded on day 1 to annual at 99.99 (a new period from then).
            event("f1", .initialPurchase, subject: "F", transaction: "f1", at: d0 + 6 * hour, period: 30 * day, price: 9.99),
            event("f2", .renewal, subject: "F", transaction: "f2", at: d0 + day, period: 365 * day, price: 99.99, product: "pro_annual"),
        ].map { EventStore.Entry(app: "demo", body: $0) }
    }

    /// A month's revenue for a price paid for a period of `days`: a month's price is itself, a year's a twelfth.
    static func monthly(_ price: Double, days: Double) -> Double { days >= 360 ? price / 12 : price }

    @Test func eachDaysMetricsAreTheHandComputedOnes() async throws {
        let backend = try await EventsBackend(clock: { Self.d0 + 100 * Self.day })
        _ = try await backend.events.record(Self.fixture())
        let days = try await backend.events.metrics(EventFilter(app: "demo"), since: Self.d0, until: Self.d0 + 31 * Self.day, now: Self.d0 + 100 * Self.day)
        #expect(days.count == 31)
        func rounded(_ value: Double) -> Double { (value * 100).rounded() / 100 }

        // Day 0, at its end: A, B, E and F paid; C and D in their trials.
        let first = days[0]
        #expect(first.activeSubscriptions == 4)
        #expect(first.activeTrials == 2)
        #expect(rounded(first.mrrUsd) == rounded(Self.monthly(9.99, days: 30) + Self.monthly(120, days: 365) + Self.monthly(10.79, days: 30) + Self.monthly(9.99, days: 30)))
        #expect(first.newSubscriptions == 4)
        #expect(first.trialStarts == 2)
        #expect(rounded(first.grossUsd) == 150.77)
        #expect(rounded(first.netUsd) == 150.77)
        #expect(first.refunds == 0)

        // Day 1: E refunded (no longer active), F upgraded (its annual period counts, once).
        let second = days[1]
        #expect(second.activeSubscriptions == 3)
        #expect(rounded(second.mrrUsd) == rounded(Self.monthly(9.99, days: 30) + Self.monthly(120, days: 365) + Self.monthly(99.99, days: 365)))
        #expect(second.newSubscriptions == 0)
        #expect(second.refunds == 1)
        #expect(rounded(second.refundsUsd) == 10.79)
        #expect(rounded(second.grossUsd) == 99.99)
        #expect(rounded(second.netUsd) == 89.2)

        // Day 7: C converts (a new paid subscription), D's trial ends unconverted (no churn: it never paid).
        let week = days[7]
        #expect(week.trialConversions == 1)
        #expect(week.newSubscriptions == 1)
        #expect(week.trialExpirations == 1)
        #expect(week.churned == 0)
        #expect(week.activeTrials == 0)
        #expect(week.activeSubscriptions == 4)
        #expect(rounded(week.mrrUsd) == rounded(
            Self.monthly(9.99, days: 30) + Self.monthly(120, days: 365) + Self.monthly(99.99, days: 365) + Self.monthly(4.99, days: 30)))

        // Day 30: A ends (churn); its MRR is gone at the day's end.
        let end = days[30]
        #expect(end.churned == 1)
        #expect(end.activeSubscriptions == 3)
        #expect(rounded(end.mrrUsd) == rounded(Self.monthly(120, days: 365) + Self.monthly(99.99, days: 365) + Self.monthly(4.99, days: 30)))
        #expect(rounded(end.mrrUsd) == 23.32)
        #expect(rounded(first.mrrUsd) == 40.77)
        #expect(days.reduce(0) { $0 + $1.churned } == 1)
        #expect(days.reduce(0) { $0 + $1.trialStarts } == 2)
        await backend.stop()
    }

    /// Days after today have no snapshot (they are not answered), and today's is as of now; a subscription
    /// ended before its period's end (a revocation) stops counting then.
    @Test func theDaysStopAtTodayAndAnEarlyEndCounts() async throws {
        let backend = try await EventsBackend(clock: { Self.d0 + 2 * Self.day + 12 * Self.hour })
        var entries = Self.fixture()
        // B's annual subscription is revoked on day 1 at noon, long before its period's end.
        entries.append(EventStore.Entry(app: "demo", body: Self.event("b2", .expiration, subject: "B", transaction: "b1", at: Self.d0 + Self.day + 12 * Self.hour, price: nil)))
        // S: a Stripe subscription refunded on day 1: Stripe keeps it running, so it stays active.
        entries.append(EventStore.Entry(app: "demo", body: Self.event("s1", .initialPurchase, subject: "sub_S", transaction: "in_s1", at: Self.d0 + 7 * Self.hour, period: 30 * Self.day, price: 5, store: .stripe)))
        entries.append(EventStore.Entry(app: "demo", body: Self.event("s2", .cancellation, subject: "sub_S", transaction: "in_s1", at: Self.d0 + Self.day + 2 * Self.hour, price: -5, refund: true, store: .stripe)))
        _ = try await backend.events.record(entries)
        let now = Self.d0 + 2 * Self.day + 12 * Self.hour
        let days = try await backend.events.metrics(EventFilter(app: "demo"), since: Self.d0, until: Self.d0 + 31 * Self.day, now: now)
        #expect(days.count == 3)
        #expect(days[0].activeSubscriptions == 5)
        #expect(days[1].activeSubscriptions == 3, "B revoked, E refunded by Apple: A, F and the refunded Stripe subscription")
        #expect(days[1].churned == 1)
        #expect(days[1].refunds == 2)
        #expect(days[2].activeSubscriptions == 3)
        await backend.stop()
    }

    @Test func theRouteAnswersTheSameNumbersAndKeepsItsBounds() async throws {
        let backend = try await EventsBackend(clock: { Self.d0 + 100 * Self.day })
        _ = try await backend.events.record(Self.fixture())
        let response = try await backend.get("/subscriptions-api/internal/v1/metrics?app=demo&since=2026-01-01&until=2026-01-03")
        #expect(response.status == 200)
        let days = try JSON.parse(response.body)["days"]?.arrayValue ?? []
        #expect(days.count == 2)
        #expect(days.first?["day"] == "2026-01-01")
        #expect(days.first?["activeSubscriptions"] == 4)
        #expect(days.first?["mrrUsd"]?.doubleValue == 40.77)
        #expect(days.last?["refunds"] == 1)
        // since and until are required, and the range is bounded.
        #expect(try await backend.get("/subscriptions-api/internal/v1/metrics?app=demo").status == 400)
        #expect(try await backend.get("/subscriptions-api/internal/v1/metrics?app=demo&since=2020-01-01&until=2026-01-01").status == 400)
        await backend.stop()
    }

    /// The console's customer page: any of a customer's ids finds them, with their subscriptions' events
    /// newest first.
    @Test func aCustomerIsFoundByAnAliasWithTheirTimeline() async throws {
        let backend = try await EventsBackend(clock: { Self.d0 + 100 * Self.day })
        _ = try await backend.events.record(Self.fixture())
        let state = SubscriptionState(
            store: .apple, originalTransactionId: "C", applicationId: 7, originalAppUserId: "user-C", appUserIds: ["user-C"], productId: "pro_monthly",
            status: .active, expiresAt: Self.d0 + 1000 * Self.day, environment: "PRODUCTION", sourceTimestamp: 1)
        guard case .written = try await backend.database.write(state, ifMatch: 0) else { throw CustomerTestFailure() }
        _ = try await backend.database.link(aliases: ["$SuperwallAlias:C"], to: "user-C", applicationId: 7, policy: .transfer, now: Self.d0)
        let response = try await backend.get("/subscriptions-api/internal/v1/customers/%24SuperwallAlias%3AC")
        #expect(response.status == 200)
        let customer = try JSON.parse(response.body)
        #expect(customer["appUserId"] == "user-C")
        #expect(customer["aliases"]?.arrayValue?.compactMap(\.stringValue) == ["$SuperwallAlias:C"])
        #expect(customer["subscriptions"]?.arrayValue?.compactMap { $0["originalTransactionId"]?.stringValue } == ["C"])
        // C's trial, then its conversion: newest first.
        #expect(customer["events"]?.arrayValue?.compactMap { $0["data"]?["id"]?.stringValue } == ["c2", "c1"])
        #expect(customer["customerInfo"] != nil)
        // An id nobody has: an empty customer, as the entitlements route answers.
        let nobody = try JSON.parse(try await backend.get("/subscriptions-api/internal/v1/customers/nobody").body)
        #expect(nobody["subscriptions"]?.arrayValue?.isEmpty == true)
        await backend.stop()
    }
}

struct CustomerTestFailure: Error {}
