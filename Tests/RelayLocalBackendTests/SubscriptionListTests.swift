import Foundation
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The subscriptions list behind `GET /subscriptions-api/internal/v1/subscriptions` (reconcile's source).
@Suite struct SubscriptionListTests {
    @Test func listsOneApplicationsActiveOrRecentlyChangedSubscriptionsInPages() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path)
        let now: Int64 = 2_000_000_000_000
        var states = [
            testSubscriptionState("active-1", status: .active, expiresAt: now + 1),
            testSubscriptionState("grace", status: .inGracePeriod, expiresAt: now - 1),
            testSubscriptionState("retry", status: .inBillingRetry, expiresAt: now - 1),
            testSubscriptionState("expired", status: .expired, expiresAt: now - 1),
            testSubscriptionState("revoked-ahead", status: .revoked, expiresAt: now + 1),
            testSubscriptionState("active-2", status: .active, expiresAt: now + 1),
        ]
        var otherApp = testSubscriptionState("other-app", status: .active)
        otherApp.applicationId = 8
        states.append(otherApp)
        var google = testSubscriptionState("google", status: .active)
        google.store = .google
        states.append(google)
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        for state in states { _ = try await database.write(state, ifMatch: 0) }

        func all(since: Int64?, limit: Int) async throws -> ([String], pages: Int) {
            var ids: [String] = []
            var cursor: Int64?
            var pages = 0
            repeat {
                let page = try await database.subscriptions(
                    store: .apple, applicationId: 7, activeOrChangedSince: since, now: now, after: cursor, limit: limit)
                ids += page.states.map(\.originalTransactionId)
                cursor = page.next
                pages += 1
            } while cursor != nil
            return (ids, pages)
        }
        // Active: a status that grants or may regain access, or an expiry ahead (even revoked: the query is wide, reconcile decides).
        let active = try await all(since: nil, limit: 2)
        #expect(active.0 == ["active-1", "grace", "retry", "revoked-ahead", "active-2"])
        #expect(active.pages == 3)
        // Changed since a time before the writes: every one of the application's Apple subscriptions.
        #expect(try await all(since: before, limit: 100).0 == ["active-1", "grace", "retry", "expired", "revoked-ahead", "active-2"])
        // Changed since the future: the active ones only.
        #expect(try await all(since: now * 2, limit: 100).0.count == 5)
    }

    /// The route: its parameters, its pages, and "active" judged at the backend's clock.
    @Test func theRouteAnswersPagesAtTheBackendsClockAndRefusesBadParameters() async throws {
        let now: Int64 = 2_000_000_000_000
        let backend = try await EventsBackend(clock: { now })
        let database = try SubscriptionDatabase(path: backend.path)
        // Expired a millisecond before the backend's now (which is years ahead of the system's).
        var active = testSubscriptionState("active", status: .active, expiresAt: now + 1)
        active.recentNotifications = [.init(id: "n-1", context: ["receivedAt": 1, "note": "é \"q\"", "prior": ["status": "ACTIVE"]])]
        for state in [active, testSubscriptionState("lapsed", status: .expired, expiresAt: now - 1)] {
            _ = try await database.write(state, ifMatch: 0)
        }
        let stored = try #require(try await database.subscription(store: .apple, originalTransactionId: "active"))
        let path = "/subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=7"
        var ids: [String] = []
        var query = path + "&limit=1"
        while true {
            let response = try await backend.get(query)
            #expect(response.status == 200)
            let page = try JSON.parse(response.body)
            ids += page["subscriptions"]?.arrayValue?.compactMap { $0["originalTransactionId"]?.stringValue } ?? []
            guard let next = page["nextCursor"]?.stringValue else { break }
            query = path + "&limit=1&cursor=" + next
        }
        #expect(ids == ["active"])
        // The state as stored, its remembered context included.
        let first = try JSON.parse(try await backend.get(path).body)["subscriptions"]?.arrayValue?.first
        #expect(try first.map { try SubscriptionState(json: $0) } == stored)
        #expect(first?.serialized() == stored.json.serialized())
        #expect(stored.recentNotifications.first?.context == ["note": "é \"q\"", "prior": ["status": "ACTIVE"], "receivedAt": 1])
        for bad in ["&limit=0", "&limit=1001", "&cursor=x", "&activeOrChangedSince=yesterday"] {
            #expect(try await backend.get(path + bad).status == 400, "\(bad)")
        }
        #expect(try await backend.get("/subscriptions-api/internal/v1/subscriptions?store=amazon&applicationId=7").status == 400)
        #expect(try await backend.get("/subscriptions-api/internal/v1/subscriptions?store=apple").status == 400)
        await backend.stop()
    }
}
