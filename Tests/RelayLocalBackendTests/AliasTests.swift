import Foundation
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import Testing

/// Linking ids to a user (`POST .../users/{appUserId}/aliases`): what was bought under an alias or a
/// device id is the user's, any id answers with the user's whole customer info, and an id another user
/// has moves or is refused by the app's `transferPolicy`. Over real HTTP, on the local backend.
@Suite struct AliasTests {
    static let alias = "$SuperwallAlias:0D7F3E1C-6A2B-4F5E-9C8D-1A2B3C4D5E6F"
    static let device = "$SuperwallDevice:5E6F7A8B-9C0D-4E1F-8A2B-3C4D5E6F7A8B"

    /// An App Store subscription of `ios` (application 1) bought under `user`, unlocking `pro`.
    func purchase(_ backend: ScopedBackend, by user: String, id: String = "3000") async throws {
        let state = SubscriptionState(
            store: .apple, originalTransactionId: id, applicationId: 1, originalAppUserId: user, appUserIds: [user],
            productId: "com.example.pro.monthly", status: .active, expiresAt: 4_000_000_000_000, environment: "PRODUCTION", sourceTimestamp: 1)
        guard case .written = try await backend.database.write(state, ifMatch: 0) else { throw ScopeTestFailure("not written") }
    }

    func entitlements(_ backend: ScopedBackend, _ id: String, _ key: KeyKind = .publicThis) async throws -> [String] {
        let path = "/subscriptions-api/public/v1/users/\(PercentEncoding.pathSegment(id))/entitlements"
        let response = try await backend.send("GET", path, key)
        #expect(response.status == 200)
        return (try JSON.parse(response.body))["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue }.sorted() ?? []
    }

    func link(_ backend: ScopedBackend, _ user: String, _ ids: [String], _ key: KeyKind = .publicThis, query: String = "") async throws -> HTTPClientResponse {
        let body = JSON.object(["aliasIds": .array(ids.map(JSON.string))]).serialized()
        return try await backend.send("POST", "/subscriptions-api/public/v1/users/\(PercentEncoding.pathSegment(user))/aliases\(query)", key, body: body)
    }

    @Test func whatWasBoughtUnderAnAliasIsTheUsersOnceLinkedAndEveryIdAnswersForTheUser() async throws {
        let backend = try await ScopedBackend()
        try await purchase(backend, by: Self.alias)
        #expect(try await entitlements(backend, "user-1") == [], "not linked yet")
        let linked = try await link(backend, "user-1", [Self.alias, Self.device])
        #expect(linked.status == 200)
        #expect((try JSON.parse(linked.body))["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        for id in ["user-1", Self.alias, Self.device] {
            #expect(try await entitlements(backend, id) == ["pro"], "\(id)")
        }
        // Idempotent: the same link again changes nothing.
        #expect(try await link(backend, "user-1", [Self.alias, Self.device, "user-1"]).status == 200)
        #expect(try await entitlements(backend, Self.device) == ["pro"])
        // Linking to an alias links to its user.
        #expect(try await link(backend, Self.device, ["$SuperwallDevice:second"]).status == 200)
        #expect(try await entitlements(backend, "$SuperwallDevice:second") == ["pro"])
        // Aliases belong to their app: what the alias bought in the other app (android, application 2) stays
        // the alias's there, and neither app's key sees the other app's purchase through the link.
        let android = SubscriptionState(
            store: .google, originalTransactionId: "token-alias", applicationId: 2, originalAppUserId: Self.alias, appUserIds: [Self.alias],
            productId: "premium_sub", status: .active, expiresAt: 4_000_000_000_000, environment: "PRODUCTION", sourceTimestamp: 1)
        guard case .written = try await backend.database.write(android, ifMatch: 0) else { throw ScopeTestFailure("not written") }
        #expect(try await entitlements(backend, Self.alias, .publicOther) == ["premium"])
        #expect(try await entitlements(backend, "user-1", .publicOther) == [])
        #expect(try await entitlements(backend, "user-1") == ["pro"])
        await backend.stop()
    }

    @Test func anIdOfAnotherUserMovesUnderTransferAndIsRefusedUnderKeep() async throws {
        // transfer (the default): the alias, and what was bought under it, moves to the second user.
        let moving = try await ScopedBackend()
        try await purchase(moving, by: Self.alias)
        #expect(try await link(moving, "user-1", [Self.alias]).status == 200)
        #expect(try await link(moving, "user-2", [Self.alias]).status == 200)
        #expect(try await entitlements(moving, "user-2") == ["pro"])
        #expect(try await entitlements(moving, "user-1") == [], "the first user no longer has it")
        await moving.stop()

        // keep: the second user is refused, nothing changes, and the first user is not named.
        let keeping = try await ScopedBackend(transferPolicy: "keep")
        try await purchase(keeping, by: Self.alias)
        #expect(try await link(keeping, "user-1", [Self.alias]).status == 200)
        let refused = try await link(keeping, "user-2", ["$SuperwallDevice:fresh", Self.alias])
        #expect(refused.status == 409)
        #expect(refused.bodyText.contains("owned_by_another_user"))
        #expect(!refused.bodyText.contains("user-1"))
        #expect(try await entitlements(keeping, "user-1") == ["pro"])
        #expect(try await entitlements(keeping, "user-2") == [])
        #expect(try await entitlements(keeping, "$SuperwallDevice:fresh") == [], "nothing of a refused request is linked")
        // A user with ids of its own is another user too.
        #expect(try await link(keeping, "user-3", ["user-1"]).status == 409)
        await keeping.stop()
    }

    @Test func aUserLinkedToAnotherBringsItsIdsUnderTransfer() async throws {
        let backend = try await ScopedBackend()
        try await purchase(backend, by: Self.device)
        #expect(try await link(backend, "anonymous-1", [Self.device]).status == 200)
        #expect(try await link(backend, "user-9", ["anonymous-1"]).status == 200)
        for id in ["user-9", "anonymous-1", Self.device] {
            #expect(try await entitlements(backend, id) == ["pro"], "\(id)")
        }
        await backend.stop()
    }

    @Test func malformedRequestsAreRefusedWithTheirReason() async throws {
        let backend = try await ScopedBackend()
        let path = "/subscriptions-api/public/v1/users/user-1/aliases"
        let bodies = [
            "{}", #"{"aliasIds": []}"#, #"{"aliasIds": "x"}"#, #"{"aliasIds": [1]}"#, #"{"aliasIds": [""]}"#,
            #"{"aliasIds": ["a\u0001b"]}"#, JSON.object(["aliasIds": .array([.string(String(repeating: "x", count: 257))])]).text,
            JSON.object(["aliasIds": .array((0..<17).map { .string("id-\($0)") })]).text, "not json",
        ]
        for body in bodies {
            let response = try await backend.send("POST", path, .publicThis, body: Array(body.utf8))
            #expect(response.status == 400, "\(body.prefix(40))")
            #expect(response.bodyText.contains("bad_request"))
        }
        let longUser = "/subscriptions-api/public/v1/users/\(String(repeating: "u", count: 257))/aliases"
        #expect(try await backend.send("POST", longUser, .publicThis, body: Array(#"{"aliasIds": ["a"]}"#.utf8)).status == 400)
        // The secret key names the app when several are configured.
        let secret = try await link(backend, "user-1", ["a"], .secret)
        #expect(secret.status == 400)
        #expect(secret.bodyText.contains("applicationId"))
        #expect(try await link(backend, "user-1", ["a"], .secret, query: "?applicationId=1").status == 200)
        #expect(try await link(backend, "user-1", ["a"], .secret, query: "?applicationId=42").status == 404)
        await backend.stop()
    }
}
