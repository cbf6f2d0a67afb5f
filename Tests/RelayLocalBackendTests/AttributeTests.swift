import Foundation
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import Testing

/// `PUT .../users/{id}/attributes`: what is stored, for which user, within which limits.
@Suite struct AttributeTests {
    func put(_ backend: ScopedBackend, _ id: String, _ body: String) async throws -> HTTPClientResponse {
        try await backend.send("PUT", "/subscriptions-api/public/v1/users/\(PercentEncoding.pathSegment(id))/attributes", .publicThis, body: Array(body.utf8))
    }

    @Test func attributesAreStoredForTheUserAnIdStandsForAndNullDeletes() async throws {
        let backend = try await ScopedBackend()
        let first = try await put(backend, "user-1", #"{"attributes": {"plan": "team", "seats": 5, "beta": true}}"#)
        #expect(first.status == 200)
        #expect(try JSON.parse(first.body)["attributes"] == ["plan": "team", "seats": 5, "beta": true])
        // Through an alias of the user: the same user's attributes.
        _ = try await backend.send(
            "POST", "/subscriptions-api/public/v1/users/user-1/aliases", .publicThis, body: Array(#"{"aliasIds": ["$SuperwallAlias:A"]}"#.utf8))
        let second = try await put(backend, "$SuperwallAlias:A", #"{"attributes": {"seats": 6, "beta": null}}"#)
        #expect(try JSON.parse(second.body)["attributes"] == ["plan": "team", "seats": 6])
        #expect(try await backend.database.appUser("$SuperwallAlias:A", applicationId: 1).attributes == ["plan": "team", "seats": 6])
        // Another app's users are another set.
        #expect(try await backend.database.appUser("user-1", applicationId: 2).attributes == [:])
        await backend.stop()
    }

    @Test func invalidAttributesAreRefusedAndNothingIsStored() async throws {
        let backend = try await ScopedBackend()
        let tooMany = JSON.object(Dictionary(uniqueKeysWithValues: (0..<65).map { ("a\($0)", JSON.integer(Int64($0))) })).text
        for body in [
            "{}", #"{"attributes": []}"#, #"{"attributes": {"nested": {"a": 1}}}"#, #"{"attributes": {"list": [1]}}"#,
            JSON.object(["attributes": ["long": .string(String(repeating: "x", count: 501))]]).text, #"{"attributes": {"": 1}}"#,
            JSON.object(["attributes": [String(repeating: "n", count: 65): 1]]).text, #"{"attributes": "#.appending(tooMany).appending("}"),
        ] {
            let response = try await put(backend, "user-2", body)
            #expect(response.status == 400, "\(body.prefix(60))")
            #expect(response.bodyText.contains("bad_request"))
        }
        // 64 a user: the 65th is refused and the request's other names are not stored either.
        let sixtyFour = JSON.object(Dictionary(uniqueKeysWithValues: (0..<64).map { ("a\($0)", JSON.integer(Int64($0))) })).text
        #expect(try await put(backend, "user-2", #"{"attributes": "#.appending(sixtyFour).appending("}")).status == 200)
        let over = try await put(backend, "user-2", #"{"attributes": {"b": 1, "c": 2}}"#)
        #expect(over.status == 400)
        #expect(over.bodyText.contains("at most 64"))
        #expect(try await backend.database.appUser("user-2", applicationId: 1).attributes.count == 64)
        #expect(try await put(backend, "user-2", #"{"attributes": {"a0": null, "b": 1}}"#).status == 200, "replacing one is fine")
        await backend.stop()
    }
}
