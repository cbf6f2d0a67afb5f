import Foundation
import RelayCore
import Testing

@Suite struct JSONTests {
    @Test func parsesEveryKindExactly() throws {
        let value = try JSON.parse(
            #" {"a": [1, -2, 3.5, 1e3, 9007199254740993, true, false, null], "s": "x\"\\\/\n\u00e9\ud83d\ude00", "o": {}} "#)
        #expect(value["a"] == [1, -2, 3.5, 1000.0, 9_007_199_254_740_993, true, false, nil])
        #expect(value["s"] == "x\"\\/\né😀")
        #expect(value["o"] == .object([:]))
        // Integers keep full 64-bit precision; Apple's fractional Xcode dates stay doubles.
        #expect(try JSON.parse("1697679936049.7297").doubleValue == 1697679936049.7297)
        #expect(try JSON.parse("1681314324000").int64Value == 1_681_314_324_000)
    }

    @Test func literalObjectsKeepEveryMemberAndTheLastOfARepeatedKey() {
        let object = JSON(dictionaryLiteral: ("a", 1), ("b", "x"), ("a", 2), ("c", [true, nil]))
        #expect(object == .object(["a": 2, "b": "x", "c": [true, nil]]))
        #expect(object.serialized() == Array(#"{"a":2,"b":"x","c":[true,null]}"#.utf8))
        let empty: JSON = [:]
        #expect(empty == .object([:]))
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"", "\"\\ud800\"", "{\"a\" 1}",
        "[1] [2]", "\"a\u{01}b\"", "nan", "1e999",
    ])
    func rejectsInvalidJSON(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSON.parse(text) }
    }

    @Test func clampsNumbersBeyondADoubleOnlyWhenAsked() throws {
        // Valid JSON (RFC 8259 sets no range): the ingest must take it, the mapping must not compute with it.
        let value = try JSON.parse(Array(#"{"a":1e999999,"b":-1e999999,"c":1}"#.utf8), clampingNumbers: true)
        #expect(value["a"]?.doubleValue == .greatestFiniteMagnitude)
        #expect(value["b"]?.doubleValue == -.greatestFiniteMagnitude)
        #expect(value["c"] == 1)
        #expect(throws: JSONParseError.self) { try JSON.parse(#"{"a":1e999999}"#) }
        #expect(throws: JSONParseError.self) { try JSON.parse(Array("1e".utf8), clampingNumbers: true) }
    }

    @Test func rejectsInvalidUTF8AndDeepNesting() {
        #expect(throws: JSONParseError.self) { try JSON.parse([0x22, 0xFF, 0x22]) }
        let deep = String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000)
        #expect(throws: JSONParseError.self) { try JSON.parse(deep) }
    }

    @Test func serializesSortedAndRoundTrips() throws {
        let value: JSON = ["b": [1, 2.5, "q\"\n\u{01}"], "a": nil, "c": true]
        #expect(value.text == #"{"a":null,"b":[1,2.5,"q\"\n\u0001"],"c":true}"#)
        #expect(try JSON.parse(value.serialized()) == value)
    }

    static let models = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../Fixtures/vectors/apple-app-store-server-library/models").standardizedFileURL

    @Test
    func agreesWithFoundationOnTheSharedVectors() throws {
        let models = Self.models
        let names = try FileManager.default.contentsOfDirectory(atPath: models.path)
        #expect(!names.isEmpty)
        for name in names where name.hasSuffix(".json") {
            let bytes = try Array(Data(contentsOf: models.appendingPathComponent(name)))
            let ours = try JSON.parse(bytes)
            let theirs = try JSONSerialization.jsonObject(with: Data(bytes)) as? NSDictionary
            let reparsed = try JSONSerialization.jsonObject(with: Data(ours.serialized())) as? NSDictionary
            #expect(reparsed == theirs, "\(name)")
        }
    }
}

@Suite struct JSONKeepingTests {
    /// `value` without the members not named in `names`, at every depth: what the keeping parse must build.
    static func pruned(_ value: JSON, to names: Set<String>) -> JSON {
        switch value {
        case .object(let members):
            var kept: [String: JSON] = [:]
            for (name, member) in members where names.contains(name) { kept[name] = pruned(member, to: names) }
            return .object(kept)
        case .array(let elements): return .array(elements.map { pruned($0, to: names) })
        default: return value
        }
    }

    /// On the shared vectors and on an event, with every name, none, and the recorder's kind of choice.
    @Test func buildsTheFullTreeWithoutTheUnnamedMembers() throws {
        let models = JSONTests.models
        var documents = try FileManager.default.contentsOfDirectory(atPath: models.path).filter { $0.hasSuffix(".json") }.map {
            try Array(Data(contentsOf: models.appendingPathComponent($0)))
        }
        documents.append(Array(#"{"type":"renewal","data":{"id":"apple:1:renewal","price":9.99,"list":[{"id":1,"x":{"id":[2]}},3],"source":{"store":"apple","n\u0061me":"x"},"na\u006de":"y"}}"#.utf8))
        #expect(documents.count > 10)
        let choices: [Set<String>] = [
            [], ["type", "data", "id", "price", "source", "store", "name", "list", "x"], ["data", "signedDate", "notificationType", "id"],
            ["type", "data", "id", "source", "store", "environment", "price", "originalTransactionId", "productId"],
        ]
        for bytes in documents {
            let full = try JSON.parse(bytes)
            var everyName = Set<String>()
            func collect(_ value: JSON) {
                switch value {
                case .object(let members): for (name, member) in members { everyName.insert(name); collect(member) }
                case .array(let elements): elements.forEach(collect)
                default: break
                }
            }
            collect(full)
            #expect(try JSON.parse(bytes, keepingMembersNamed: JSON.MemberNames(Array(everyName))) == full)
            for names in choices + [everyName.subtracting(["id"])] {
                #expect(try JSON.parse(bytes, keepingMembersNamed: JSON.MemberNames(Array(names))) == Self.pruned(full, to: names))
            }
        }
    }

    /// A member left out is still checked: what `parse` refuses there is refused.
    @Test(arguments: [
        #"{"a":1,"skip":[1,]}"#, #"{"a":1,"skip":{"x":01}}"#, #"{"a":1,"skip":"\x"}"#, #"{"a":1,"skip":1e999}"#,
        #"{"a":1,"skip":tru}"#, #"{"a":1,"sk\ip":1}"#, "{\"a\":1,\"skip\":\"\u{01}\"}", #"{"a":1,"skip":"\ud800"}"#,
        #"{"a":1,"skip" 1}"#, #"{"a":1,"skip":1,}"#, #"{"a":1,"skip":1} x"#,
    ])
    func refusesWhatParseRefusesInAMemberLeftOut(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSON.parse(text) }
        #expect(throws: JSONParseError.self) { try JSON.parse(Array(text.utf8), keepingMembersNamed: ["a"]) }
    }

    @Test func refusesInvalidUTF8InANameLeftOut() throws {
        let bytes: [UInt8] = Array(#"{"a":1,""#.utf8) + [0xFF] + Array(#"":2}"#.utf8)
        #expect(throws: JSONParseError.self) { try JSON.parse(bytes, keepingMembersNamed: ["a"]) }
        let accented = Array(#"{"a":1,"é":2}"#.utf8)
        #expect(try JSON.parse(accented, keepingMembersNamed: ["é"]) == ["é": 2])
        #expect(try JSON.parse(accented, keepingMembersNamed: ["a"]) == ["a": 1])
    }
}

@Suite struct JSONFastPathTests {
    @Test func integersAreExactOnBothSidesOfTheShortcut() throws {
        for (text, value) in [
            ("0", Int64(0)), ("-0", 0), ("999999999999999999", 999_999_999_999_999_999), ("-999999999999999999", -999_999_999_999_999_999),
            ("1000000000000000000", 1_000_000_000_000_000_000), ("9223372036854775807", .max), ("-9223372036854775808", .min),
        ] {
            #expect(try JSON.parse(text) == .integer(value), "\(text)")
        }
        // Beyond Int64: a Double, as before.
        #expect(try JSON.parse("9223372036854775808") == .number(9_223_372_036_854_775_808))
    }

    @Test func stringsKeepTheirTextWhicheverPathReadsOrWritesThem() throws {
        for text in ["", "plain ascii", "é", "😀 mixed é text", "quote \" and \\ backslash", "controls \n\r\t\u{01}\u{1F}", "/"] {
            let value = JSON.string(text)
            #expect(try JSON.parse(value.serialized()) == value, "\(text)")
        }
        #expect(JSON.string("a\"b\\c\n\u{01}é").text == #""a\"b\\c\n\u0001é""#)
        #expect(throws: JSONParseError.self) { try JSON.parse([0x22, 0x61, 0xC3, 0x28, 0x22]) }
    }

    /// The string scan reads eight bytes at a time: every byte value, at every offset of a word and past
    /// its end, must stop it exactly where a byte-at-a-time scan would.
    @Test func everyByteIsSeenWhereverItFallsInTheWordScan() throws {
        for offset in 0..<19 {
            let before = [UInt8](repeating: UInt8(ascii: "a"), count: offset)
            let after = [UInt8](repeating: UInt8(ascii: "b"), count: 19 - offset)
            for byte in UInt8.min...UInt8.max {
                let document = [UInt8(ascii: "\"")] + before + [byte] + after + [UInt8(ascii: "\"")]
                switch byte {
                case UInt8(ascii: "\""):
                    #expect(throws: JSONParseError.self, "a quote at \(offset) ends the string") { try JSON.parse(document) }
                case UInt8(ascii: "\\"):
                    // `\b` is a backspace escape.
                    #expect(try JSON.parse(document) == .string(String(repeating: "a", count: offset) + "\u{08}" + String(repeating: "b", count: 18 - offset)))
                case ..<0x20:
                    #expect(throws: JSONParseError.self, "control byte \(byte) at \(offset)") { try JSON.parse(document) }
                case 0x80...:
                    // Alone, any byte above ASCII is invalid UTF-8: the scan must not take the string as ASCII.
                    #expect(throws: JSONParseError.self, "non-ASCII byte \(byte) at \(offset)") { try JSON.parse(document) }
                default:
                    #expect(try JSON.parse(document).stringValue?.utf8.elementsEqual(before + [byte] + after) == true, "byte \(byte) at \(offset)")
                }
            }
            // Valid non-ASCII in a word the fast path passed over is kept.
            #expect(try JSON.parse([UInt8(ascii: "\"")] + before + [0xC3, 0xA9] + after + [UInt8(ascii: "\"")]).stringValue == String(repeating: "a", count: offset) + "é" + String(repeating: "b", count: 19 - offset))
            #expect(throws: JSONParseError.self, "unterminated at \(offset)") { try JSON.parse([UInt8(ascii: "\"")] + before + after) }
        }
    }

    /// The serializer passes over runs eight bytes at a time too: every ASCII byte, at every offset of a word
    /// and in the tail, is read back as it was by Foundation's parser (which shares nothing with ours), and no
    /// control byte is written raw.
    @Test func everyByteIsWrittenSoThatItReadsBackWhereverItFalls() throws {
        func foundation(_ bytes: [UInt8]) throws -> String? {
            try JSONSerialization.jsonObject(with: Data(bytes), options: .fragmentsAllowed) as? String
        }
        for offset in 0..<19 {
            for byte in UInt8(0)..<0x80 {
                let text = String(repeating: "a", count: offset) + String(UnicodeScalar(byte)) + String(repeating: "b", count: 19 - offset)
                let written = JSON.string(text).serialized()
                #expect(!written.contains { $0 < 0x20 }, "byte \(byte) at \(offset) written raw")
                #expect(try foundation(written) == text, "byte \(byte) at \(offset)")
            }
            let accented = String(repeating: "a", count: offset) + "é\"" + String(repeating: "b", count: 19 - offset)
            #expect(try foundation(JSON.string(accented).serialized()) == accented)
        }
    }

    @Test func membersAreWrittenInNameOrderWhateverTheirText() {
        let value: JSON = ["é": 1, "z": 2, "A": 3, "a": ["y": 1, "b": 2], "": 0]
        #expect(value.text == #"{"":0,"A":3,"a":{"b":2,"y":1},"z":2,"é":1}"#)
    }

    @Test func aSplicedMemberTakesItsPlaceInNameOrderAndReplacesOneOfItsName() {
        let members: [String: JSON] = ["c": .integer(3), "a": .integer(1), "b": .string("replaced")]
        let bytes = JSON.serializedObject(members, splicing: "b") { output in
            JSON.writeArray([#"{"x":1}"#, "[]"], to: &output) { text, output in output.append(contentsOf: text.utf8) }
        }
        #expect(String(decoding: bytes, as: UTF8.self) == #"{"a":1,"b":[{"x":1},[]],"c":3}"#)
        #expect(JSON.serializedObject([:], splicing: "only") { $0.append(contentsOf: "null".utf8) } == Array(#"{"only":null}"#.utf8))
    }
}
