import RelayCore
import Testing

/// A subscription state as the local backend stores it: `serialized()` is `json`'s bytes, and a state read
/// back with `init(serialized:)` keeps its remembered contexts as bytes until they are read.
@Suite struct StoredStateTests {
    static func state() -> SubscriptionState {
        let prior = SubscriptionState(
            store: .apple, originalTransactionId: "2000000100000001", applicationId: 1, originalAppUserId: "user-1", appUserIds: ["user-1"],
            productId: "com.example.pro.monthly", status: .active, expiresAt: 1_900_000_000_000, lastTransactionId: "2000000100000009",
            sourceTimestamp: 1_890_000_000_000)
        var state = prior
        state.version = 7
        state.transactions = [.init(id: "t1", productId: "com.example.pro.monthly", purchasedAt: 1, periodType: .normal, amount: "9.99", currency: "USD")]
        state.recentNotifications = (0..<16).map { index in
            .init(
                id: "n-\(index)",
                context: [
                    "receivedAt": .integer(1_890_000_000_000 + Int64(index)), "prior": prior.json, "others": [],
                    // Text that takes each of the parser's and writer's slower paths.
                    "note": .string("é \"quoted\" \\ tab\t \u{01} 😀"), "rate": 0.85, "big": .integer(Int64.max), "small": .integer(Int64.min),
                ])
        }
        return state
    }

    @Test func theStoredFormIsTheJSONsBytesAndReadsBackUnchanged() throws {
        let state = Self.state()
        let bytes = state.serialized()
        #expect(bytes == state.json.serialized())
        let read = try SubscriptionState(serialized: bytes)
        #expect(read == state)
        #expect(read.recentNotifications.map(\.context) == state.recentNotifications.map(\.context))
        // Written back byte for byte, contexts untouched.
        #expect(read.serialized() == bytes)
        #expect(read.json == state.json)
        #expect(try SubscriptionState(json: JSON.parse(bytes)) == read)
    }

    @Test func aContextChangedAfterReadingIsWrittenAsChanged() throws {
        var read = try SubscriptionState(serialized: Self.state().serialized())
        read.recentNotifications[3].context = ["replaced": true]
        read.recentNotifications.append(.init(id: "n-new", context: ["receivedAt": 5]))
        let bytes = read.serialized()
        #expect(bytes == read.json.serialized())
        let again = try SubscriptionState(serialized: bytes)
        #expect(again.recentNotifications[3].context == ["replaced": true])
        #expect(again.recentNotifications.last?.context == ["receivedAt": 5])
        #expect(again.recentNotifications.count == 17)
        #expect(again != (try SubscriptionState(serialized: Self.state().serialized())))
    }

    @Test func anotherWritersFormattingReadsAsTheSameValue() throws {
        // Whitespace and another member order (a platform's backend may store the JSON its own way).
        let text = """
            { "version": 3, "store": "apple", "status": "ACTIVE", "productId": "p", "originalTransactionId": "1", "applicationId": 1,
              "sourceTimestamp": 10, "recentNotifications": [ { "id": "a", "context": { "z": [1, 2.5, "é"], "a": null } }, { "id": "b" } ] }
            """
        let read = try SubscriptionState(serialized: Array(text.utf8))
        let tree = try SubscriptionState(json: JSON.parse(text))
        #expect(read == tree)
        #expect(read.recentNotifications[0].context == ["a": nil, "z": [1, 2.5, "é"]])
        #expect(read.recentNotifications[1].context == .null)
        #expect(read.json.serialized() == tree.json.serialized())
    }

    @Test func aRepeatedListKeepsNothingOfTheOneItReplaces() throws {
        // The later member wins, as in any parse; the first list's kept context must not surface in the second.
        let text = #"{"store":"apple","status":"ACTIVE","productId":"p","originalTransactionId":"1","applicationId":1,"sourceTimestamp":1,"recentNotifications":[{"id":"a","context":{"x":1}}],"recentNotifications":[{"id":"b"}]}"#
        let read = try SubscriptionState(serialized: Array(text.utf8))
        #expect(read == (try SubscriptionState(json: JSON.parse(text))))
        #expect(read.recentNotifications.map(\.id) == ["b"])
        #expect(read.recentNotifications[0].context == .null)
    }

    static let longInteger = "1" + String(repeating: "0", count: 400)

    @Test(arguments: [
        // Accepted: kept as bytes, and read as parsing reads them.
        #"{"a":1}"#, "{}", "[]", #""text""#, "null", "12345678901234567890", "-0", "1.5e3", #"{"con\u0074ext":{"é":[true]}}"#,
        "-" + longInteger.dropLast(100),
        // Refused by parsing, so refused when kept as bytes.
        #"{"s":"\#u{01}"}"#, #"{"s":"abc}"#, "[1,]", #"{"a":1,}"#, #"{"n":1e999}"#, #"{"n":01}"#, #"{"s":"\x"}"#,
        #"{"s":"\ud800"}"#, #"{"s":"\udc00"}"#, "tru", #"{"a" 1}"#, longInteger, "-" + longInteger, "",
    ])
    func aContextKeptAsBytesIsRefusedExactlyWhenParsingRefusesIt(_ context: String) throws {
        // The first entry has no context, the second has this one: each keeps its own.
        let text = #"{"store":"apple","status":"ACTIVE","productId":"p","originalTransactionId":"1","applicationId":1,"sourceTimestamp":1,"recentNotifications":[{"id":"a"},{"id":"b","context":"#
            + context + "}]}"
        let tree = try? JSON.parse(text)
        let read = try? SubscriptionState(serialized: Array(text.utf8))
        #expect((tree == nil) == (read == nil), "parsed: \(tree != nil), kept: \(read != nil)")
        guard let tree, let read else { return }
        #expect(read == (try SubscriptionState(json: tree)))
        #expect(read.recentNotifications[0].context == .null)
        #expect(read.recentNotifications[1].context == tree["recentNotifications"]?.arrayValue?[1]["context"])
    }

    @Test func invalidUTF8AndDeepNestingInAContextAreRefused() {
        let head = Array(#"{"store":"apple","status":"ACTIVE","productId":"p","originalTransactionId":"1","applicationId":1,"sourceTimestamp":1,"recentNotifications":[{"id":"a","context":"#.utf8)
        let tail = Array("}]}".utf8)
        #expect(throws: JSONParseError.self) { try SubscriptionState(serialized: head + [0x22, 0xC3, 0x28, 0x22] + tail) }
        // In a member name inside the context too.
        #expect(throws: JSONParseError.self) { try SubscriptionState(serialized: head + Array(#"{""#.utf8) + [0xC3, 0x28] + Array(#"":1}"#.utf8) + tail) }
        let deep = Array((String(repeating: "[", count: 200) + String(repeating: "]", count: 200)).utf8)
        #expect(throws: JSONParseError.self) { try SubscriptionState(serialized: head + deep + tail) }
    }
}
