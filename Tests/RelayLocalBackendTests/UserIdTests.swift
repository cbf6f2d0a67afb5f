import Foundation
import RelayCore
import RelayHTTPClient
@testable import RelayLocalBackend
import Testing

/// The ids a route that names a user takes. GRDB binds text up to its first NUL, so an id holding one would
/// act on another user than the one named (`user%00other` on `user`); the other control characters are no id an
/// app or a store hands out. Every such route refuses them, for every key that reaches it.
@Suite struct UserIdTests {
    /// A NUL, C0 controls, DEL and a C1 control (U+0085), percent-encoded as a path carries them.
    static let controlIds = ["user%00other", "user%01", "user%0Aline", "user%7F", "user%C2%85"]

    /// The table's cases of the routes with a user in their path (`KeyScopeTests.swift`).
    static var userRoutes: [ScopeCase] { scopeTable.filter { $0.route.path.contains(":appUserId") } }

    @Test func everyRouteNamingAUserRefusesAControlCharacterForEveryKeyThatReachesIt() async throws {
        let backend = try await ScopedBackend()
        // Entitlements, the user, attributes, aliases, app transactions, purchases, customers, grants (two).
        #expect(Set(Self.userRoutes.map(\.route)).count == 9)
        for scope in Self.userRoutes {
            let keys = KeyKind.allCases.filter { scope.expected[$0] != nil }
            #expect(!keys.isEmpty, "\(scope.route)")
            for key in keys {
                for id in Self.controlIds {
                    let path = scope.path.replacingOccurrences(of: "/shared-user", with: "/" + id)
                    let response = try await backend.send(scope.method, path, key, body: Array(scope.body.utf8))
                    #expect(response.status == 400, "\(scope.method) \(path) with \(key)")
                    // Refused for the id, not for anything else the request holds (a grant's body is refused too).
                    #expect(
                        response.bodyText.contains("bad_request") && response.bodyText.contains("control characters"),
                        "\(scope.method) \(path) with \(key): \(response.bodyText)")
                }
            }
        }
        await backend.stop()
    }

    @Test func theAppUserIdFilterOfTheEventsAndDeliveriesRoutesIsHeldToTheSameRule() async throws {
        let backend = try await ScopedBackend()
        // The metrics route also needs its period.
        let routes = ["events?", "revenue?", "metrics?since=2026-01-01&until=2026-02-01&", "deliveries?"].map { "/subscriptions-api/internal/v1/\($0)appUserId=" }
        for route in routes {
            for id in Self.controlIds {
                for key in [KeyKind.secret, .readThis] {
                    let response = try await backend.send("GET", route + id, key)
                    #expect(response.status == 400 && response.bodyText.contains("control characters"), "\(route)\(id) with \(key): \(response.bodyText)")
                }
            }
            let valid = try await backend.send("GET", route + "shared-user", .secret)
            #expect(valid.status == 200, "\(route): \(valid.bodyText)")
        }
        await backend.stop()
    }

    @Test func theDeviceIdOfAnEntitlementsRequestIsHeldToTheSameRule() async throws {
        let backend = try await ScopedBackend()
        let path = "/subscriptions-api/public/v1/users/shared-user/entitlements"
        for device in Self.controlIds {
            let response = try await backend.send("GET", path + "?deviceId=" + device, .publicThis)
            #expect(response.status == 400, "\(device)")
            #expect(response.bodyText.contains("deviceId"))
        }
        #expect(try await backend.send("GET", path + "?deviceId=device-1", .publicThis).status == 200)
        await backend.stop()
    }

    @Test func aRefusedIdChangesNoUser() async throws {
        let backend = try await ScopedBackend()
        let aliases = #"{"aliasIds": ["$SuperwallAlias:nul"]}"#
        let attributes = #"{"attributes": {"plan": "team"}}"#
        let cut = "/subscriptions-api/public/v1/users/user%00other"
        #expect(try await backend.send("POST", cut + "/aliases", .publicThis, body: Array(aliases.utf8)).status == 400)
        #expect(try await backend.send("PUT", cut + "/attributes", .publicThis, body: Array(attributes.utf8)).status == 400)
        // `user`, where the NUL would have cut the id, has neither the alias nor the attribute.
        let user = try await backend.send("GET", "/subscriptions-api/internal/v1/users/user?applicationId=1", .secret)
        #expect(user.status == 200)
        #expect((try JSON.parse(user.body))["aliases"]?.arrayValue?.isEmpty == true, "\(user.bodyText)")
        let alias = try await backend.send("GET", "/subscriptions-api/internal/v1/users/%24SuperwallAlias%3Anul?applicationId=1", .secret)
        #expect((try JSON.parse(alias.body))["appUserId"]?.stringValue == "$SuperwallAlias:nul", "linked to no one: \(alias.bodyText)")
        let customer = try await backend.send("GET", "/subscriptions-api/internal/v1/customers/user?applicationId=1", .secret)
        #expect(customer.status == 200)
        #expect((try JSON.parse(customer.body))["attributes"]?.objectValue?.isEmpty ?? true, "\(customer.bodyText)")
        await backend.stop()
    }

    @Test func idsWithAnyOtherCharacterStillNameTheirUser() async throws {
        let backend = try await ScopedBackend()
        // Spaces, quotes, a slash, non-ASCII letters and an emoji: what an app may use as an id.
        let id = "naïve user \"42\"/😀"
        let encoded = id.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let aliases = #"{"aliasIds": ["$SuperwallAlias:ok"]}"#
        let linked = try await backend.send("POST", "/subscriptions-api/public/v1/users/\(encoded)/aliases", .publicThis, body: Array(aliases.utf8))
        #expect(linked.status == 200, "\(linked.bodyText)")
        let user = try await backend.send("GET", "/subscriptions-api/internal/v1/users/%24SuperwallAlias%3Aok?applicationId=1", .secret)
        #expect((try JSON.parse(user.body))["appUserId"]?.stringValue == id, "\(user.bodyText)")
        #expect(try await backend.send("GET", "/subscriptions-api/public/v1/users/\(encoded)/entitlements", .publicThis).status == 200)
        await backend.stop()
    }
}
