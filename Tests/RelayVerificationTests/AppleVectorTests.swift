import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
@testable import RelayVerification
import Testing

/// Apple's own library fixtures and one real Apple-signed notification (`Tests/Fixtures/vectors`).
@Suite
struct AppleVectorTests {
    let vectors = Fixtures.sharedVectors ?? URL(fileURLWithPath: "/")
    var library: URL { vectors.appendingPathComponent("apple-app-store-server-library") }

    func text(_ path: String) throws -> String {
        try String(contentsOf: library.appendingPathComponent(path), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func appleVerifier(bundleId: String = "com.example", appAppleId: Int64? = 1234, environments: [String], root: String) throws -> AppleVerifier {
        try AppleVerifier(
            app: "vectors",
            configuration: RelayConfiguration.Apple(bundleId: bundleId, appAppleId: appAppleId, environments: environments, rootCertificates: [root]))
    }

    var testRoot: String { library.appendingPathComponent("certs/testCA.der").path }

    func body(_ signedPayload: String) -> [UInt8] { JSON.object(["signedPayload": .string(signedPayload)]).serialized() }

    @Test func acceptsTheLibrarysTestNotification() throws {
        let signed = try text("mock_signed_data/testNotification")
        let verifier = try appleVerifier(environments: ["Sandbox"], root: testRoot)
        let notification = try verifier.verify(body: body(signed))
        #expect(notification.type == "TEST")
        #expect(notification.notificationId == "9ad56bd2-0bc6-42e0-af24-fd996d87a1e6")
        let production = try appleVerifier(environments: ["Production"], root: testRoot)
        #expect(rejected { try production.verify(body: body(signed)) } == .wrongEnvironment)
        let otherBundle = try appleVerifier(bundleId: "com.example.x", environments: ["Sandbox"], root: testRoot)
        #expect(rejected { try otherBundle.verify(body: body(signed)) } == .wrongBundleId)
    }

    @Test func verifiesTheLibrarysSignedTransactionAndRenewalInfo() throws {
        let verifier = try appleVerifier(environments: ["Sandbox"], root: testRoot)
        #expect(try verifier.verifySignedData(text("mock_signed_data/transactionInfo"))["bundleId"] == "com.example")
        #expect(try verifier.verifySignedData(text("mock_signed_data/renewalInfo"))["environment"] == "Sandbox")
        let other = try appleVerifier(bundleId: "com.example.x", environments: ["Sandbox"], root: testRoot)
        #expect(rejected { try other.verifySignedData(text("mock_signed_data/transactionInfo")) } == .wrongBundleId)
    }

    @Test func rejectsTheLibrarysBrokenSamples() throws {
        let verifier = try appleVerifier(environments: ["Sandbox", "Production"], root: testRoot)
        // Signed correctly, but with neither signedDate nor environment: docs/verification.md's section calls it malformed.
        #expect(rejected { try verifier.verify(body: body(text("mock_signed_data/wrongBundleId"))) } == .malformed)
        #expect(rejected { try verifier.verify(body: body(text("mock_signed_data/missingX5CHeaderClaim"))) } == .malformed)
        #expect(rejected { try verifier.verify(body: body(text("mock_signed_data/legacyTransaction"))) } == .malformed)
    }

    @Test func decodesXcodeDataOnlyWhenXcodeIsListed() throws {
        let signed = try text("xcode/xcode-signed-transaction")
        let xcode = try appleVerifier(bundleId: "com.example.naturelab.backyardbirds.example", environments: ["Xcode"], root: testRoot)
        #expect(try xcode.verifySignedData(signed)["environment"] == "Xcode")
        let production = try appleVerifier(bundleId: "com.example.naturelab.backyardbirds.example", environments: ["Production"], root: testRoot)
        #expect(rejected { try production.verifySignedData(signed) } == .wrongEnvironment)
    }

    @Test func decodesTheLibrarysModelsAsLocalTestingData() throws {
        // As the libraries' own tests do: the JSON models in an unsigned JWS, verified for LocalTesting.
        func unsigned(_ name: String) throws -> String {
            let payload = try Data(contentsOf: library.appendingPathComponent("models/\(name)"))
            return Base64.encodeURL(Array(#"{"alg":"ES256"}"#.utf8)) + "." + Base64.encodeURL(Array(payload)) + ".c2lnbmF0dXJl"
        }
        let verifier = try appleVerifier(appAppleId: 41234, environments: ["LocalTesting"], root: testRoot)
        let summary = try verifier.verify(body: body(unsigned("signedSummaryNotification.json")))
        #expect(summary.payload["summary"]?["succeededCount"] == 5)
        #expect(summary.subtype == "SUMMARY")
        let rescind = try verifier.verify(body: body(unsigned("signedRescindConsentNotification.json")))
        #expect(rescind.type == "RESCIND_CONSENT")

        // The notification model's nested values are placeholders; put the transaction and renewal models in.
        var model = try JSON.parse(Array(Data(contentsOf: library.appendingPathComponent("models/signedNotification.json"))))
        if case .object(var members) = model, case .object(var data) = members["data"] {
            data["signedTransactionInfo"] = .string(try unsigned("signedTransaction.json"))
            data["signedRenewalInfo"] = .string(try unsigned("signedRenewalInfo.json"))
            members["data"] = .object(data)
            model = .object(members)
        }
        let jws = Base64.encodeURL(Array(#"{"alg":"ES256"}"#.utf8)) + "." + Base64.encodeURL(model.serialized()) + ".c2ln"
        let notification = try verifier.verify(body: body(jws))
        #expect(notification.payload["data"]?["signedTransactionInfo"]?["price"] == 10990)
        #expect(notification.payload["data"]?["signedRenewalInfo"]?["expirationIntent"] == 1)

        // External purchase tokens: the environment comes from the id's SANDBOX prefix; sign them for real.
        let signer = AppleSigner()
        let fixtures = try AppleVerifier(
            app: "vectors",
            configuration: RelayConfiguration.Apple(
                bundleId: "com.example", appAppleId: 55555, environments: ["Sandbox", "Production"], rootCertificates: [Fixtures.path("apple/root.pem")]))
        for (name, environment) in [("signedExternalPurchaseTokenNotification.json", "Production"), ("signedExternalPurchaseTokenSandboxNotification.json", "Sandbox")] {
            var model = try JSON.parse(Array(Data(contentsOf: library.appendingPathComponent("models/\(name)"))))
            if case .object(var members) = model {
                members["signedDate"] = .integer(Fixtures.signedDate)  // within the fixture certificates' validity
                model = .object(members)
            }
            #expect(try fixtures.verify(body: signer.body(model)).environment == environment, "\(name)")
        }
    }

    @Test func checksTheLibrarysInlineChains() throws {
        func base64(_ name: String) throws -> String {
            Base64.encode(Array(try Data(contentsOf: library.appendingPathComponent("inline-certs/\(name)"))))
        }
        let effectiveDate: Int64 = 1_761_962_975
        let verifier = try appleVerifier(environments: ["Sandbox"], root: library.appendingPathComponent("inline-certs/ROOT_CA_BASE64_ENCODED.der").path)
        let leaf = try base64("LEAF_CERT_BASE64_ENCODED.der")
        let intermediate = try base64("INTERMEDIATE_CA_BASE64_ENCODED.der")
        let (key, _) = try verifier.chainKey(leaf: leaf, intermediate: intermediate, at: effectiveDate, what: "x5c")
        #expect(key.kind == .ecP256)

        func reason(_ leaf: String, _ intermediate: String, at time: Int64 = effectiveDate, verifier: AppleVerifier) -> RejectReason? {
            do {
                _ = try verifier.chainKey(leaf: leaf, intermediate: intermediate, at: time, what: "x5c")
                return nil
            } catch {
                return error.reason
            }
        }
        let fresh = try appleVerifier(environments: ["Sandbox"], root: testRoot)
        #expect(reason(try base64("LEAF_CERT_INVALID_OID_BASE64_ENCODED.der"), intermediate, verifier: fresh) == .missingAppleOID)
        #expect(
            reason(try base64("LEAF_CERT_FOR_INTERMEDIATE_CA_INVALID_OID_BASE64_ENCODED.der"), try base64("INTERMEDIATE_CA_INVALID_OID_BASE64_ENCODED.der"), verifier: fresh)
                == .missingAppleOID)
        #expect(reason(leaf, intermediate, at: 2_280_946_846, verifier: fresh) == .certificateExpired)
        let realRoot = try appleVerifier(environments: ["Sandbox"], root: library.appendingPathComponent("inline-certs/REAL_APPLE_ROOT_BASE64_ENCODED.der").path)
        #expect(reason(leaf, intermediate, verifier: realRoot) == .untrustedChain)
        // Apple's real WWDR G6 intermediate and receipt-signing leaf chain to Apple Root CA - G3.
        #expect(
            reason(try base64("REAL_APPLE_SIGNING_CERTIFICATE_BASE64_ENCODED.der"), try base64("REAL_APPLE_INTERMEDIATE_BASE64_ENCODED.der"), verifier: realRoot)
                == nil)
    }

    /// A real notification Apple signed, from an Apache-2.0 repository
    /// (`Tests/Fixtures/vectors/apple-real/MANIFEST.md`): Apple's real chain, accepted at its signed date.
    @Test func acceptsARealAppleSignedNotificationAtItsSignedDate() throws {
        let real = vectors.appendingPathComponent("apple-real")
        let signed = try String(contentsOf: real.appendingPathComponent("consumption_request_production.jws"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let appleRoot = real.appendingPathComponent("AppleRootCA-G3.der").path
        let bundle = "com.jrjj.keysns"
        let verifier = try appleVerifier(bundleId: bundle, appAppleId: 1_601_830_814, environments: ["Production"], root: appleRoot)
        let notification = try verifier.verify(body: body(signed))
        #expect(notification.type == "CONSUMPTION_REQUEST")
        #expect(notification.notificationId == "cbff6987-b8d9-43d8-b1dc-07fa8c9fd945")

        let testRootOnly = try appleVerifier(bundleId: bundle, appAppleId: 1_601_830_814, environments: ["Production"], root: testRoot)
        #expect(rejected { try testRootOnly.verify(body: body(signed)) } == .untrustedChain)
        let sandbox = try appleVerifier(bundleId: bundle, environments: ["Sandbox"], root: appleRoot)
        #expect(rejected { try sandbox.verify(body: body(signed)) } == .wrongEnvironment)
        let otherBundle = try appleVerifier(bundleId: "com.example", appAppleId: 1_601_830_814, environments: ["Production"], root: appleRoot)
        #expect(rejected { try otherBundle.verify(body: body(signed)) } == .wrongBundleId)

        // Changing the payload breaks Apple's signature.
        let parts = signed.split(separator: ".").map(String.init)
        var payload = try JSON.parse(Base64.decode(parts[1])!)
        if case .object(var members) = payload, case .object(var data) = members["data"] {
            data["bundleId"] = "com.example"
            members["data"] = .object(data)
            payload = .object(members)
        }
        let forged = parts[0] + "." + Base64.encodeURL(payload.serialized()) + "." + parts[2]
        let forgedVerifier = try appleVerifier(bundleId: "com.example", appAppleId: 1_601_830_814, environments: ["Production"], root: appleRoot)
        #expect(rejected { try forgedVerifier.verify(body: body(forged)) } == .badSignature)
    }
}

/// The reason `body` was rejected with; nil when it passed or failed otherwise.
func rejected(_ body: () throws -> Any) -> RejectReason? {
    do {
        _ = try body()
        return nil
    } catch {
        return (error as? Rejection)?.reason
    }
}
