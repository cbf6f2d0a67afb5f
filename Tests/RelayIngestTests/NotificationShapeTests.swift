import Foundation
import RelayCore
@testable import RelayIngest
import RelayTestSupport
import Testing

/// The ingest's structural checks (`NotificationShape`): what the stores really send passes, taken from
/// the fixtures; near misses, and what no store sends, are refused with a reason naming the field.
@Suite struct NotificationShapeTests {
    func mismatch(_ store: Store, _ body: String, _ headers: [String: String] = [:]) throws -> String? {
        NotificationShape.mismatch(store: store, document: try JSON.parse(body), header: { headers[$0] })?.detail
    }

    func vector(_ path: String) throws -> String {
        try String(contentsOf: Fixtures.sharedVectors!.appendingPathComponent(path), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func appleBody(_ jws: String) -> String { #"{"signedPayload":"\#(jws)"}"# }

    @Test func realAppleNotificationsPass() throws {
        // Signed by Apple (a real production notification), by Apple's library fixtures, and by the test chain.
        #expect(try mismatch(.apple, appleBody(vector("apple-real/consumption_request_production.jws"))) == nil)
        #expect(try mismatch(.apple, appleBody(vector("apple-app-store-server-library/mock_signed_data/testNotification"))) == nil)
        #expect(try mismatch(.apple, String(decoding: AppleSigner().body(AppleSigner().notificationPayload()), as: UTF8.self)) == nil)
    }

    @Test func appleNearMissesAreRefused() throws {
        let signed = AppleSigner().sign(AppleSigner().notificationPayload())
        let parts = signed.split(separator: ".").map(String.init)
        func header(_ json: String) -> String { Base64.encodeURL(Array(json.utf8)) + "." + parts[1] + "." + parts[2] }
        let cases: [(String, String)] = [
            (#"{"signedPayload":42}"#, "no signedPayload"),
            (#"{"notificationType":"DID_RENEW"}"#, "no signedPayload"),
            (appleBody("not-a-jws"), "not a compact JWS"),
            (appleBody(parts[0] + "." + parts[1]), "not a compact JWS"),
            (appleBody(signed + ".extra"), "not a compact JWS"),
            (appleBody(parts[0] + ".." + parts[2]), "not a compact JWS"),
            (appleBody(parts[0] + "." + parts[1] + "+/." + parts[2]), "not a compact JWS"),
            (appleBody(Base64.encodeURL(Array("not json".utf8)) + "." + parts[1] + "." + parts[2]), "not base64url JSON"),
            (appleBody(header(#"{"alg":"RS256","x5c":["MIIB"]}"#)), "alg ES256"),
            (appleBody(header(#"{"alg":"none","x5c":["MIIB"]}"#)), "alg ES256"),
            (appleBody(header(#"{"alg":"ES256"}"#)), "no x5c"),
            (appleBody(header(#"{"alg":"ES256","x5c":[]}"#)), "no x5c"),
            (appleBody(header(#"{"alg":"ES256","x5c":"MIIB"}"#)), "no x5c"),
            (appleBody(header(#"{"alg":"ES256","x5c":[""]}"#)), "no x5c"),
        ]
        for (body, reason) in cases {
            let detail = try #require(try mismatch(.apple, body), "\(body.prefix(80)) passed")
            #expect(detail.contains(reason), "\(detail)")
        }
        // Apple's library fixture without an x5c header is refused here already.
        #expect(try mismatch(.apple, appleBody(vector("apple-app-store-server-library/mock_signed_data/missingX5CHeaderClaim")))?.contains("x5c") == true)
    }

    /// The character check reads eight bytes at a time: every byte value, at every offset of a word and in
    /// the tail after the last whole word, is judged as a byte-at-a-time check would.
    @Test func everyByteIsJudgedWhereverItFallsInTheWordCheck() {
        let allowed = Set(Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.".utf8))
        for length in [1, 7, 8, 9, 16, 19] {
            for offset in 0..<length {
                for byte in UInt8.min...UInt8.max {
                    var bytes = [UInt8](repeating: UInt8(ascii: "Q"), count: length)
                    bytes[offset] = byte
                    let judged = bytes.withUnsafeBufferPointer { NotificationShape.base64URLOrDots($0) }
                    #expect(judged == allowed.contains(byte), "byte \(byte) at \(offset) of \(length)")
                }
            }
        }
        #expect([UInt8]().withUnsafeBufferPointer { NotificationShape.base64URLOrDots($0) })
    }

    @Test func aCompactTokenHasThreeNonEmptyPartsOfItsAlphabet() {
        #expect(NotificationShape.compactHeader("ab.c-d.e_f") == Array("ab".utf8))
        for text in ["", "ab", "ab.cd", "ab.cd.ef.gh", ".cd.ef", "ab..ef", "ab.cd.", "ab.c=d.ef", "ab.cd.e f", "ab.cd.é"] {
            #expect(NotificationShape.compactHeader(text) == nil, "\(text)")
        }
    }

    @Test func dotsAreFoundAlikeInContiguousAndOtherBytes() {
        for text in ["a.b.c", "..", "a.b", "a.b.c.d", "", "abc", "longer.than.eight-bytes", ".x.", "x.y.z."] {
            let bytes = Array(text.utf8)
            let expected = bytes.lazy.map { $0 }.indices.filter { bytes[$0] == UInt8(ascii: ".") }
            let want: (Int, Int)? = expected.count == 2 ? (expected[0], expected[1]) : nil
            let contiguous = JWSPayload.dots(in: bytes)
            let other = JWSPayload.dots(in: bytes.lazy.map { $0 })
            #expect(contiguous?.first == want?.0 && contiguous?.second == want?.1, "\(text)")
            #expect(other?.first == want?.0 && other?.second == want?.1, "\(text)")
            // A slice's indices are its base's.
            let slice = (Array("zz".utf8) + bytes)[2...]
            let sliced = JWSPayload.dots(in: slice)
            #expect(sliced?.first == want.map { $0.0 + 2 } && sliced?.second == want.map { $0.1 + 2 }, "\(text)")
        }
    }

    @Test func googlePushesPassAndNearMissesAreRefused() throws {
        let signer = GooglePushSigner()
        let token = signer.token(GooglePushSigner.claims(issuedAt: 1_893_456_000))
        let body = String(decoding: GooglePushSigner.envelope(GooglePushSigner.developerNotification()), as: UTF8.self)
        #expect(try mismatch(.google, body, ["authorization": "Bearer \(token)"]) == nil)
        #expect(try mismatch(.google, body, ["authorization": "bearer \(token)"]) == nil, "the scheme is case-insensitive")
        // Google's own sample push envelope.
        let samples = try JSON.parse(Array(vector("google-play/samples.json").utf8))
        let sample = try #require(samples["official_envelope_example"]?["envelope"])
        #expect(try mismatch(.google, sample.text, ["authorization": "Bearer \(token)"]) == nil)
        let cases: [(String, [String: String], String)] = [
            (body, [:], "no Authorization"),
            (body, ["authorization": "Basic dXNlcjpwYXNz"], "not a Bearer token"),
            (body, ["authorization": "Bearer"], "not a Bearer token"),
            (body, ["authorization": "Bearer abc.def"], "not a Bearer token"),
            (body, ["authorization": "Bearer a.b.c.d"], "not a Bearer token"),
            (body, ["authorization": "Bearer a.b!.c"], "not a Bearer token"),
            (#"{"message":{"messageId":"1"}}"#, ["authorization": "Bearer \(token)"], "message.data"),
            (#"{"message":{"data":""}}"#, ["authorization": "Bearer \(token)"], "message.data"),
            (#"{"data":"eyJ9"}"#, ["authorization": "Bearer \(token)"], "message.data"),
        ]
        for (body, headers, reason) in cases {
            let detail = try #require(try mismatch(.google, body, headers), "\(body) \(headers) passed")
            #expect(detail.contains(reason), "\(detail)")
        }
    }

    @Test func stripeAndPaddleSignatureHeadersNeedTheirFields() throws {
        let stripe = try JSON.parse(Array(vector("stripe/derived_vectors.json").utf8))
        let stripeCases = try #require(stripe["cases"]?.arrayValue)
        let stripeNames = Set(stripeCases.compactMap { $0["name"]?.stringValue })
        #expect(stripeNames.isSuperset(of: ["malformed", "v0_only"]))
        for testCase in stripeCases {
            let name = try #require(testCase["name"]?.stringValue)
            let result = try mismatch(.stripe, #"{"id":"evt_1"}"#, ["stripe-signature": testCase["header"]?.stringValue ?? ""])
            // A wrong or old signature is plausibly real (the worker rejects it); a header without v1 or t is not.
            if name == "malformed" || name == "v0_only" {
                #expect(result != nil, "\(name)")
            } else {
                #expect(result == nil, "\(name): \(result ?? "")")
            }
        }
        let paddle = try JSON.parse(Array(vector("paddle/derived_vectors.json").utf8))
        let paddleCases = try #require(paddle["cases"]?.arrayValue)
        #expect(!paddleCases.isEmpty)
        for testCase in paddleCases {
            #expect(try mismatch(.paddle, #"{"event_id":"evt_1"}"#, ["paddle-signature": testCase["header"]?.stringValue ?? ""]) == nil)
        }
        for header in [nil, "", "t=1700000000", "v1=abc", "t=soon,v1=abc", "t=1700000000,v1=", "t=1700000000;v1=abc"] as [String?] {
            let headers = header.map { ["stripe-signature": $0] } ?? [:]
            #expect(try mismatch(.stripe, "{}", headers) != nil, "\(header ?? "no header")")
        }
        for header in [nil, "ts=1692804778", "h1=abc", "ts=x;h1=abc", "ts=1692804778,h1=abc", "ts=1692804778;h1="] as [String?] {
            let headers = header.map { ["paddle-signature": $0] } ?? [:]
            #expect(try mismatch(.paddle, "{}", headers) != nil, "\(header ?? "no header")")
        }
    }

    /// The one-pass JWS scanner against every way a string can fail to be three base64url parts.
    @Test(arguments: [
        ("eyJhIjoxfQ.cGF5bG9hZA.c2ln", "eyJhIjoxfQ"), ("A-_z09.b.c", "A-_z09"), ("a.b.c", "a"),
        ("a.b", nil), ("a.b.c.d", nil), (".b.c", nil), ("a..c", nil), ("a.b.", nil), ("", nil), ("...", nil),
        ("a=.b.c", nil), ("a.b.c=", nil), ("a+b.c.d", nil), ("a/b.c.d", nil), ("a.b c.d", nil), ("é.b.c", nil), ("a.b.c\n", nil),
        ("@.b.c", nil), ("[.b.c", nil), ("`.b.c", nil), ("{.b.c", nil),
    ] as [(String, String?)])
    func compactJWSPartsAreCheckedByteByByte(_ text: String, _ header: String?) {
        #expect(NotificationShape.compactHeader(text).map { String(decoding: $0, as: UTF8.self) } == header, "\(text)")
    }
}
