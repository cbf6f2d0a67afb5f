import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
import RelayVerification
import Testing

/// Signed AppTransactions (grandfathered access): `AppleVerifier.verify(appTransaction:)` with the
/// notification chain rules, and the local backend's `relay-source: app-transaction` records.
@Suite struct AppTransactionVerificationTests {
    let signer = AppleSigner()

    static func appTransaction(
        environment: String? = "Sandbox", receiptType: String = "Sandbox", appAppleId: Int64 = 1234, bundleId: String = "com.example.app"
    ) -> JSON {
        var object: [String: JSON] = [
            "receiptType": .string(receiptType), "appAppleId": .integer(appAppleId), "bundleId": .string(bundleId), "applicationVersion": "3.0",
            "originalApplicationVersion": "1.2", "originalPurchaseDate": 1_600_000_000_000, "signedDate": .integer(Fixtures.signedDate),
            "appTransactionId": "704289572311504712",
        ]
        if let environment { object["environment"] = .string(environment) }
        return .object(object)
    }

    static let production = Self.appTransaction(environment: "Production", receiptType: "Production")

    /// The fixture app: `[Sandbox, Production]` unless told.
    func verifier(environments: [String] = ["Sandbox", "Production"]) throws -> AppleVerifier {
        let configuration = try Fixtures.configuration(environments: environments)
        return try AppleVerifier(app: "demo", configuration: try #require(configuration.apps.first?.apple))
    }

    func reason(_ text: String, environments: [String] = ["Sandbox", "Production"]) throws -> RejectReason? {
        do {
            _ = try verifier(environments: environments).verify(appTransaction: text)
            return nil
        } catch let rejection as Rejection {
            return rejection.reason
        }
    }

    @Test func aSignedAppTransactionOfTheAppIsAccepted() throws {
        let payload = try verifier().verify(appTransaction: signer.sign(Self.production))
        #expect(payload["originalApplicationVersion"] == "1.2")
        // Older AppTransactions have only receiptType.
        #expect(try reason(signer.sign(Self.appTransaction(environment: nil, receiptType: "Production"))) == nil)
        // A sandbox-only test app takes Sandbox ones.
        #expect(try reason(signer.sign(Self.appTransaction()), environments: ["Sandbox"]) == nil)
        #expect(try reason(signer.sign(Self.appTransaction(environment: nil)), environments: ["Sandbox", "Xcode"]) == nil)
    }

    /// Apple sets originalApplicationVersion to "1.0" for every sandbox (TestFlight) AppTransaction, so a
    /// version rule would grant every tester: an app with Production takes Production ones only, and
    /// unsigned Xcode/LocalTesting data grants nothing anywhere.
    @Test func sandboxAndUnsignedAppTransactionsAreRefusedWhereTheyWouldGrantProductionAccess() throws {
        #expect(try reason(signer.sign(Self.appTransaction())) == .wrongEnvironment)
        #expect(try reason(signer.sign(Self.appTransaction(environment: nil))) == .wrongEnvironment)
        #expect(try reason(signer.sign(Self.appTransaction()), environments: ["Production"]) == .wrongEnvironment)
        // The environment claim decides, not which of the two fields carries it.
        #expect(try reason(signer.sign(Self.appTransaction(environment: "Sandbox", receiptType: "Production"))) == .wrongEnvironment)
        // Unsigned data, even when the app lists that environment (and unsigned, so no signature to check).
        for unsigned in ["Xcode", "LocalTesting"] {
            let text = signer.sign(Self.appTransaction(environment: unsigned, receiptType: unsigned))
            #expect(try reason(text, environments: ["Sandbox", "Production", unsigned]) == .wrongEnvironment)
            #expect(try reason(text, environments: ["Sandbox", unsigned]) == .wrongEnvironment)
            #expect(try reason(text, environments: [unsigned]) == .wrongEnvironment)
            let forged = text.split(separator: ".").prefix(2).joined(separator: ".") + ".AAAA"
            #expect(try reason(forged, environments: [unsigned]) == .wrongEnvironment)
        }
    }

    @Test func refusedAppTransactionsNameTheirReason() throws {
        let genuine = signer.sign(Self.appTransaction()).split(separator: ".").map(String.init)
        let forged = [genuine[0], Base64.encodeURL(Self.appTransaction(bundleId: "com.example.app").serialized() + [0x20]), genuine[2]].joined(separator: ".")
        #expect(try reason(forged) == .badSignature)
        #expect(try reason(signer.sign(Self.appTransaction(bundleId: "com.other"))) == .wrongBundleId)
        #expect(try reason(signer.sign(Self.appTransaction(environment: "Xcode", receiptType: "Xcode"))) == .wrongEnvironment)
        #expect(try reason(signer.sign(Self.appTransaction(environment: "Production", receiptType: "Production", appAppleId: 99))) == .wrongAppAppleId)
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
        #expect(try reason(rogue.sign(Self.production)) == .untrustedChain)
        #expect(try reason("not a jws") == .malformed)
        // Exactly three parts: two or four are not a compact JWS, whatever they carry.
        let signed = signer.sign(Self.production)
        #expect(try reason(genuine[0] + "." + genuine[1]) == .malformed)
        #expect(try reason(signed + "." + genuine[2]) == .malformed)
        #expect(try reason(signed) == nil)
    }

    @Test func anAppTransactionRecordIsVerifiedAgainAndRoutedBySource() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        func verdict(_ body: [UInt8], source: String = AppTransactionGrant.source, store: Store = .apple) async throws -> Verdict {
            try await verifier.verify(
                RawNotification(store: store, app: "demo", receivedAtMilliseconds: Fixtures.signedDate, body: body, requestHeaders: [:], source: source))
        }
        let body = AppTransactionGrant.body(signedAppTransaction: signer.sign(Self.production), appUserId: "user-1", rule: 0)
        let notification = try #require(try await verdict(body).notification)
        #expect(notification.type == "APP_TRANSACTION")
        #expect(notification.notificationId == "app-transaction:704289572311504712:user-1")
        #expect(notification.environment == "Production")
        #expect(notification.payload["data"]?["appUserId"] == "user-1")
        #expect(notification.payload["data"]?["appTransaction"]?["originalApplicationVersion"] == "1.2")
        #expect(notification.payload["signedDate"]?.int64Value == Fixtures.signedDate)

        let forged = AppTransactionGrant.body(signedAppTransaction: signer.sign(Self.appTransaction(bundleId: "com.other")), appUserId: "u", rule: 0)
        #expect(try await verdict(forged).rejection?.reason == .wrongBundleId)
        // The worker holds records to the same environments as the route: no sandbox grant for a Production app.
        let sandbox = AppTransactionGrant.body(signedAppTransaction: signer.sign(Self.appTransaction()), appUserId: "u", rule: 0)
        #expect(try await verdict(sandbox).rejection?.reason == .wrongEnvironment)
        #expect(try await verdict(Array(#"{"appUserId": "u"}"#.utf8)).rejection?.reason == .malformed)
        // Only Apple records may carry it.
        #expect(try await verdict(body, store: .stripe).rejection?.reason == .malformed)
    }

    @Test func rulesCompareVersionsAsNumbersAndDatesStrictly() {
        let version = RelayConfiguration.GrandfatheringRule(entitlements: ["pro"], originalAppVersionBelow: "2.0")
        #expect(version.matches(["originalApplicationVersion": "1.9.3"]))
        #expect(version.matches(["originalApplicationVersion": "1.10"]))
        #expect(!version.matches(["originalApplicationVersion": "2.0"]))
        #expect(!version.matches(["originalApplicationVersion": "2"]))
        #expect(!version.matches(["originalApplicationVersion": "10.0"]))
        #expect(!version.matches(["originalApplicationVersion": "1.0b"]))
        #expect(!version.matches([:]))
        let both = RelayConfiguration.GrandfatheringRule(entitlements: ["pro"], originalAppVersionBelow: "145", purchasedBefore: 1_000)
        #expect(both.matches(["originalApplicationVersion": "144", "originalPurchaseDate": 999]))
        #expect(!both.matches(["originalApplicationVersion": "144", "originalPurchaseDate": 1_000]))
        #expect(!both.matches(["originalApplicationVersion": "146", "originalPurchaseDate": 999]))
    }
}
