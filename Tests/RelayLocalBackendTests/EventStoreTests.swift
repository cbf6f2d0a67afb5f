import Foundation
import GRDB
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import ServiceLifecycle
import Testing

/// A local backend on 127.0.0.1 (port 0) over a fresh SQLite file, with its events store.
final class EventsBackend: Sendable {
    let path: String
    let port: Int
    let events: EventStore
    let database: SubscriptionDatabase
    let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(60))
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    /// `clock`: the backend's now (Unix ms), else the system's.
    init(clock: (@Sendable () -> Int64)? = nil) async throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("events") + "/backend.sqlite").path
        let configuration = try RelayConfiguration.parse(
            yaml: """
                backend: { apiKey: "test-key", database: "\(path)", listen: "127.0.0.1:0" }
                apps:
                  - { key: demo, projectId: 1, applicationId: 7, stripe: { signingSecrets: ["whsec_x"] } }
                """, baseDirectory: "/", environment: [:])
        database = try SubscriptionDatabase(path: path)
        let backend = try LocalBackend(configuration: configuration, database: database, clock: clock)
        events = backend.events
        let ports = AsyncStream.makeStream(of: Int.self)
        let application = backend.application(logger: testLogger()) { port in ports.continuation.yield(port) }
        group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: testLogger())
        let group = self.group
        task = Task { try await group.run() }
        var iterator = ports.stream.makeAsyncIterator()
        port = await iterator.next() ?? 0
    }

    func get(_ pathAndQuery: String) async throws -> HTTPClientResponse {
        try await http.send("GET", "http://127.0.0.1:\(port)\(pathAndQuery)", headers: [("Authorization", "Bearer test-key")])
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

/// A standardized event as the worker writes it, with what the tests vary.
func testEvent(
    _ id: String, type: EventType = .renewal, store: Store = .apple, environment: String = "PRODUCTION", user: String? = "user-1",
    subject: String = "1000", product: String? = "com.example.pro.monthly", ts: Int64 = 1_767_225_600_000, price: Double? = 9.99,
    proceeds: Double? = 8.49, currency: String? = "USD", local: Double? = nil, applicationId: Int = 7, notification: String?? = nil
) -> [UInt8] {
    let storeName = ["apple": "APP_STORE", "google": "PLAY_STORE", "stripe": "STRIPE", "paddle": "PADDLE"][store.rawValue]!
    let data = StoreEventData(
        id: id, name: type, cancelReason: price.map { $0 < 0 } == true ? .customerSupport : nil, expirationReason: nil,
        exchangeRate: price == nil ? nil : 1, isSmallBusiness: false, periodType: .normal, countryCode: "US", price: price, proceeds: proceeds,
        priceInPurchasedCurrency: local ?? price, currencyCode: currency, taxPercentage: nil, commissionPercentage: 0.15, takehomePercentage: 0.85,
        offerCode: nil, isFamilyShare: false, expirationAt: nil, transactionId: "t-\(id)", originalTransactionId: subject, originalAppUserId: user,
        store: storeName, purchasedAt: ts, productId: product, environment: environment, isTrialConversion: false, newProductId: nil,
        bundleId: nil, ts: ts, sdkEvents: [], entitlements: [], subscriptionStatus: SubscriptionStatus(entitlements: ["pro"]),
        gracePeriodExpiresAt: nil, source: EventSource(store: store, notificationId: notification ?? id, type: "DID_RENEW", subtype: nil))
    return WireCoding.encode(EventPayload(type: type, projectId: 1, applicationId: applicationId, timestamp: ts + 5, data: .store(data)))
}

@Suite struct EventStoreTests {
    /// Exports page through whole apps (`?app=demo`): each page must walk an index in recorded order,
    /// or SQLite sorts every event the filter matches for every page (5 s for 100,000 events).
    @Test(arguments: [
        EventFilter(), EventFilter(app: "demo"), EventFilter(app: "demo", since: 1), EventFilter(app: "demo", types: [.renewal]),
        EventFilter(appUserId: "user-1"), EventFilter(originalTransactionId: "sub-1"), EventFilter(notificationId: "n-1"),
    ])
    func aPageWalksAnIndexInRecordedOrder(_ filter: EventFilter) async throws {
        let path = EventsFile.path("events-plan")
        defer { EventsFile.remove(path) }
        let plan = try await EventStore(database: try SubscriptionDatabase(path: path)).pagePlan(filter)
        #expect(!plan.isEmpty)
        #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
    }

    @Test func recordingIsIdempotentOnTheEventIdAndRefusesWhatIsNotAnEvent() async throws {
        let backend = try await EventsBackend()
        let first = try await backend.events.record([
            .init(app: "demo", body: testEvent("apple:n1:renewal")), .init(app: "demo", body: testEvent("apple:n2:renewal")),
        ])
        #expect(first.inserted == 2 && first.invalid.isEmpty)
        // The same events again (a repeat notification, or relay.events read again) and one new one.
        let again = try await backend.events.record([
            .init(app: "demo", body: testEvent("apple:n1:renewal")), .init(app: "demo", body: Array("{\"not\":\"an event\"}".utf8)),
            .init(app: "demo", body: testEvent("apple:n3:renewal")), .init(app: "demo", body: testEvent("apple:n2:renewal")),
        ])
        #expect(again.inserted == 1)
        #expect(again.invalid.map(\.0) == [1])
        #expect(try await backend.events.count() == 3)
        await backend.stop()
    }

    @Test func theQueryFiltersAndPagesWithACursorInRecordedOrder() async throws {
        let backend = try await EventsBackend()
        var entries: [EventStore.Entry] = []
        for index in 0..<25 {
            let body = testEvent(
                "e\(index)", type: index % 5 == 0 ? .initialPurchase : .renewal, store: index % 3 == 0 ? .stripe : .apple,
                environment: index % 4 == 0 ? "SANDBOX" : "PRODUCTION", user: "user-\(index % 3)", subject: "sub-\(index % 2)",
                ts: 1_767_225_600_000 + Int64(index) * 86_400_000)
            entries.append(.init(app: index < 20 ? "demo" : "other", body: body))
        }
        _ = try await backend.events.record(entries)

        func ids(_ query: String) async throws -> (ids: [String], next: String?) {
            let response = try await backend.get("/subscriptions-api/internal/v1/events\(query)")
            #expect(response.status == 200, "\(query): \(String(decoding: response.body, as: UTF8.self))")
            let document = try JSON.parse(response.body)
            return (document["events"]?.arrayValue?.compactMap { $0["data"]?["id"]?.stringValue } ?? [], document["nextCursor"]?.stringValue)
        }
        let all = (0..<25).map { "e\($0)" }
        #expect(try await ids("?limit=1000").ids == all)
        #expect(try await ids("?app=other").ids == ["e20", "e21", "e22", "e23", "e24"])
        #expect(try await ids("?appUserId=user-1").ids == all.enumerated().filter { $0.offset % 3 == 1 }.map(\.element))
        #expect(try await ids("?originalTransactionId=sub-1&limit=1000").ids == all.enumerated().filter { $0.offset % 2 == 1 }.map(\.element))
        #expect(try await ids("?type=initial_purchase").ids == ["e0", "e5", "e10", "e15", "e20"])
        #expect(try await ids("?type=initial_purchase,renewal&limit=1000").ids == all)
        #expect(try await ids("?store=stripe").ids == all.enumerated().filter { $0.offset % 3 == 0 }.map(\.element))
        #expect(try await ids("?store=STRIPE").ids == all.enumerated().filter { $0.offset % 3 == 0 }.map(\.element))
        #expect(try await ids("?environment=SANDBOX").ids == ["e0", "e4", "e8", "e12", "e16", "e20", "e24"])
        // The time range is on the store's event time: since inclusive, until exclusive; dates and RFC 3339 alike.
        #expect(try await ids("?since=2026-01-03&until=2026-01-05T00:00:00Z").ids == ["e2", "e3"])
        #expect(try await ids("?since=\(1_767_225_600_000 + 23 * 86_400_000)").ids == ["e23", "e24"])
        #expect(try await ids("?app=demo&type=renewal&environment=PRODUCTION&appUserId=user-2").ids == ["e2", "e11", "e14", "e17"])

        // Pages of 10: every event once, in order, and the last page says there is no next one.
        var pages: [[String]] = []
        var cursor: String?
        repeat {
            let page = try await ids("?limit=10" + (cursor.map { "&cursor=\($0)" } ?? ""))
            pages.append(page.ids)
            cursor = page.next
        } while cursor != nil
        #expect(pages.map(\.count) == [10, 10, 5])
        #expect(pages.flatMap { $0 } == all)
        // Default page size 100; a cursor past the end is an empty last page.
        #expect(try await ids("").ids.count == 25)
        #expect(try await ids("?cursor=999999") == ([], nil))

        for (query, parameter) in [
            ("?type=refund", "type"), ("?store=amazon", "store"), ("?since=yesterday", "since"), ("?limit=0", "limit"),
            ("?limit=1001", "limit"), ("?cursor=abc", "cursor"), ("?environment=STAGING", "environment"),
        ] {
            let response = try await backend.get("/subscriptions-api/internal/v1/events\(query)")
            #expect(response.status == 400, "\(query)")
            #expect(try JSON.parse(response.body)["detail"]?.stringValue?.hasPrefix(parameter + ":") == true, "\(query)")
        }
        #expect(try await backend.http.send("GET", "http://127.0.0.1:\(backend.port)/subscriptions-api/internal/v1/events").status == 401)
        await backend.stop()
    }

    @Test func revenueIsTheSumOfTheRecordedEventsByDayProductStoreAndCurrency() async throws {
        let backend = try await EventsBackend()
        let day = Int64(86_400_000)
        let start = Int64(1_767_225_600_000)  // 2026-01-01T00:00:00Z
        // (id, store, product, day offset, USD price, proceeds, purchased currency, environment)
        let fixtures: [(String, Store, String, Int64, Double?, Double?, String, String)] = [
            ("a", .apple, "pro.monthly", 0, 9.99, 8.49, "USD", "PRODUCTION"),
            ("b", .apple, "pro.monthly", 0, 10.87, 9.24, "EUR", "PRODUCTION"),
            ("c", .apple, "pro.yearly", 0, 59.99, 50.99, "USD", "PRODUCTION"),
            ("d", .stripe, "price_pro", 1, 12.5, 12.5, "USD", "PRODUCTION"),
            ("e", .apple, "pro.monthly", 1, -9.99, -8.49, "USD", "PRODUCTION"),  // a refund
            ("f", .google, "pro:monthly", 1, 4.33, 3.68, "INR", "PRODUCTION"),
            ("g", .apple, "pro.monthly", 1, 0, 0, "USD", "PRODUCTION"),  // a product change: no money
            ("h", .apple, "pro.monthly", 1, nil, nil, "JPY", "PRODUCTION"),  // no exchange rate
            ("i", .apple, "pro.monthly", 0, 9.99, 8.49, "USD", "SANDBOX"),
        ]
        _ = try await backend.events.record(fixtures.map { fixture in
            .init(
                app: "demo",
                body: testEvent(
                    fixture.0, type: (fixture.4 ?? 0) < 0 ? .cancellation : .renewal, store: fixture.1, environment: fixture.7, product: fixture.2,
                    ts: start + fixture.3 * day + 3_600_000, price: fixture.4, proceeds: fixture.5, currency: fixture.6, local: fixture.4 == nil ? 1500 : nil))
        })

        let response = try await backend.get("/subscriptions-api/internal/v1/revenue?app=demo&groupBy=day,product,store,currency")
        #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
        let report = try JSON.parse(response.body)
        let rows = report["rows"]?.arrayValue ?? []
        // The expected sums, computed here over the production fixtures that moved money.
        let production = fixtures.filter { $0.7 == "PRODUCTION" && $0.4 != nil }
        let groups = Dictionary(grouping: production) { fixture in
            ["2026-01-0\(fixture.3 + 1)", fixture.2, fixture.1.rawValue, fixture.6].joined(separator: "|")
        }
        #expect(rows.count == groups.count)
        for row in rows {
            let key = ["day", "product", "store", "currency"].map { row[$0]?.stringValue ?? "-" }.joined(separator: "|")
            let members = try #require(groups[key], "unexpected group \(key)")
            let prices = members.compactMap(\.4)
            #expect(row["gross"]?.doubleValue == cents(prices.filter { $0 > 0 }.reduce(0, +)), "\(key)")
            #expect(row["refunds"]?.doubleValue == cents(-prices.filter { $0 < 0 }.reduce(0, +)), "\(key)")
            #expect(row["net"]?.doubleValue == cents(prices.reduce(0, +)), "\(key)")
            #expect(row["proceeds"]?.doubleValue == cents(members.compactMap(\.5).reduce(0, +)), "\(key)")
            #expect(row["purchases"]?.int64Value == Int64(prices.filter { $0 > 0 }.count), "\(key)")
        }
        let all = production.compactMap(\.4)
        #expect(report["total"]?["gross"]?.doubleValue == cents(all.filter { $0 > 0 }.reduce(0, +)))
        #expect(report["total"]?["refunds"]?.doubleValue == 9.99)
        #expect(report["total"]?["net"]?.doubleValue == cents(all.reduce(0, +)))
        #expect(report["eventsWithoutRate"] == 1)
        #expect(report["currency"] == "USD")

        // Without grouping, one row; sandbox only when asked for.
        let sandbox = try JSON.parse(try await backend.get("/subscriptions-api/internal/v1/revenue?environment=SANDBOX").body)
        #expect(sandbox["rows"]?.arrayValue?.count == 1 && sandbox["total"]?["gross"] == 9.99)
        let everything = try JSON.parse(try await backend.get("/subscriptions-api/internal/v1/revenue?environment=ALL&groupBy=month").body)
        #expect(everything["rows"]?.arrayValue?.first?["month"] == "2026-01")
        #expect(everything["total"]?["gross"]?.doubleValue == cents(all.filter { $0 > 0 }.reduce(0, +) + 9.99))
        let bad = try await backend.get("/subscriptions-api/internal/v1/revenue?groupBy=week")
        #expect(bad.status == 400)
        await backend.stop()
    }

    private func cents(_ value: Double) -> Double { (value * 100).rounded() / 100 }
}
