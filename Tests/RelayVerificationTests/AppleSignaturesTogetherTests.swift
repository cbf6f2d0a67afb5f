import RelayCore
import RelayCrypto
import RelayTestSupport
@testable import RelayVerification
import Testing

/// A notification's three signatures checked together, ahead of their turns, once their chain is cached with
/// its key's table (`AppleVerifier.checkAhead`): every notification is accepted or refused exactly as when
/// each is checked alone in its turn, for the same first fault and with the same words.
@Suite struct AppleSignaturesTogetherTests {
    let signer = AppleSigner()
    /// Apple's chain with another key's signatures: what a forger who copied the certificates signs.
    let forger = {
        var forger = AppleSigner()
        forger.key = Fixtures.privateKey("apple/rogue-leaf.key")
        return forger
    }()

    /// A verifier whose chain is cached and whose key has its table: it checks signatures together.
    func warmVerifier() throws -> AppleVerifier {
        let verifier = try AppleVerifier(
            app: "demo", configuration: #require(Fixtures.configuration().apps.first?.apple), configurationKey: "apple",
            chainCacheCapacity: 64, prepareKeys: { #expect($0.prepareFixedBaseTable()) })
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        #expect(verifier.cachedChainsWithTables == 1)
        return verifier
    }

    /// A verifier that caches nothing: each signature is checked alone, in its turn.
    func coldVerifier() throws -> AppleVerifier {
        try AppleVerifier(
            app: "demo", configuration: #require(Fixtures.configuration().apps.first?.apple), configurationKey: "apple",
            chainCacheCapacity: 0, prepareKeys: { _ in })
    }

    /// What a verifier says of `body`: accepted (the decoded payload) or refused (the reason and its words).
    func outcome(_ verifier: AppleVerifier, _ body: [UInt8]) -> (text: String, refusal: RejectReason?) {
        do {
            return ("accepted \(try verifier.verify(body: body).payload.serialized())", nil)
        } catch {
            return ("refused \(error.reason) \(error.detail)", error.reason)
        }
    }

    /// `payload` with `data[member]` replaced.
    func replacing(_ payload: JSON, _ member: String, with value: String) -> JSON {
        guard case .object(var members) = payload, case .object(var data) = members["data"] else { return payload }
        data[member] = .string(value)
        members["data"] = .object(data)
        return .object(members)
    }

    @Test func aNotificationsThreeSignaturesAreCheckedTogetherOnceTheChainIsCached() throws {
        let payload = signer.notificationPayload()
        let tokens = try ["signedTransactionInfo", "signedRenewalInfo"].map { member in
            try CompactJWS(#require(payload["data"]?[member]?.stringValue), what: "data.\(member)")
        }
        let outer = try CompactJWS(signer.sign(payload), what: "signedPayload")
        let all: [(jws: CompactJWS, claimedEnvironment: String?)?] = [(outer, "Sandbox"), (tokens[0], "Sandbox"), (tokens[1], "Sandbox")]

        // Nothing cached: nothing is checked ahead.
        #expect(try coldVerifier().checkAhead(all).allSatisfy { $0 == nil })
        let warm = try warmVerifier()
        let ahead = warm.checkAhead(all)
        #expect(ahead.allSatisfy { $0?.valid == true && $0?.time == Fixtures.signedDate / 1000 })
        // A forged one among them is refused, the others not; one alone, or unsigned data, is left to its turn.
        let forged = try CompactJWS(forger.sign(payload), what: "signedPayload")
        #expect(warm.checkAhead([(forged, "Sandbox"), all[1], all[2]]).map { $0?.valid } == [false, true, true])
        #expect(warm.checkAhead([all[0], nil, nil]).allSatisfy { $0 == nil })
        #expect(warm.checkAhead([all[0], (tokens[0], "Xcode"), nil]).allSatisfy { $0 == nil })
        // Without the notification's own signature among them (its chain not cached), none: the notification
        // may be refused before the nested JWSs' turn.
        let uncached = try CompactJWS(Self.rogue.sign(payload), what: "signedPayload")
        #expect(warm.checkAhead([(uncached, "Sandbox"), all[1], all[2]]).allSatisfy { $0 == nil })
        #expect(warm.checkAhead([nil, all[1], all[2]]).allSatisfy { $0 == nil })
    }

    /// A notification's verification takes its signatures' answers from the check ahead: all three for one
    /// whose claims pass, none for one refused by them, none with `verifyNestedSignatures: false`.
    @Test func verifyingANotificationChecksItsSignaturesAheadOnlyWhenItsClaimsPass() throws {
        let warm = try warmVerifier()
        #expect(warm.signaturesAnsweredAhead == 0)
        _ = try warm.verify(body: signer.body(signer.notificationPayload()))
        #expect(warm.signaturesAnsweredAhead == 3)
        for payload in [
            signer.notificationPayload(bundleId: "com.other.app"), signer.notificationPayload(environment: "Production", appAppleId: 9999),
            signer.notificationPayload(transaction: AppleSigner.transaction(bundleId: "com.other.app")),
        ] {
            #expect(throws: Rejection.self) { try warm.verify(body: signer.body(payload)) }
        }
        // A transaction of another bundle is left to its turn, where it is refused; the renewal behind it is
        // not checked ahead either, and the notification's own signature, alone, is checked in its turn.
        #expect(warm.signaturesAnsweredAhead == 3)
        #expect(throws: Rejection.self) { try warm.verify(body: Self.rogue.body(signer.notificationPayload())) }
        #expect(warm.signaturesAnsweredAhead == 3)

        let vouching = try AppleVerifier(
            app: "demo", configuration: #require(Fixtures.configuration(verifyNestedSignatures: false).apps.first?.apple),
            configurationKey: "apple", chainCacheCapacity: 64, prepareKeys: { #expect($0.prepareFixedBaseTable()) })
        _ = try vouching.verify(body: signer.body(signer.notificationPayload()))
        _ = try vouching.verify(body: signer.body(signer.notificationPayload()))
        #expect(vouching.cachedChainsWithTables == 1 && vouching.signaturesAnsweredAhead == 0)
    }

    /// Another chain (the rogue root's, not configured): never cached.
    static let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])

    /// Genuine and forged notifications, with faults in every place and several at once, each verified with
    /// and without checks ahead: the same verdict, for the same first fault, in the same words.
    @Test(arguments: [true, false])
    func everyNotificationIsJudgedAsWhenEachSignatureIsCheckedAlone(verifyNestedSignatures: Bool) throws {
        let apple = try #require(Fixtures.configuration(verifyNestedSignatures: verifyNestedSignatures).apps.first?.apple)
        let warm = try AppleVerifier(
            app: "demo", configuration: apple, configurationKey: "apple", chainCacheCapacity: 64,
            prepareKeys: { #expect($0.prepareFixedBaseTable()) })
        let cold = try AppleVerifier(app: "demo", configuration: apple, configurationKey: "apple", chainCacheCapacity: 0, prepareKeys: { _ in })
        _ = try warm.verify(body: signer.body(signer.notificationPayload()))
        #expect(warm.cachedChainsWithTables == 1)

        let genuine = signer.notificationPayload()
        let forgedTransaction = forger.sign(AppleSigner.transaction())
        let forgedRenewal = forger.sign(AppleSigner.renewalInfo())
        let otherBundle = signer.sign(AppleSigner.transaction(bundleId: "com.other.app"))
        let otherEnvironment = signer.sign(AppleSigner.transaction(environment: "Production"))
        // Signed after the chain's certificates expire: its chain is not the cached one's at its date.
        let late = signer.sign(AppleSigner.transaction(signedDate: 2_500_000_000_000))
        // Signed a day before the notification, within the chain's validity.
        let earlier = signer.sign(AppleSigner.transaction(signedDate: Fixtures.signedDate - 86_400_000))
        // A transaction whose signature is one byte short (63), canonical base64url.
        let signedParts = signer.sign(AppleSigner.transaction()).split(separator: ".").map(String.init)
        let shortSignature = try "\(signedParts[0]).\(signedParts[1]).\(Base64.encodeURL(Array(#require(Base64.decode(signedParts[2])).dropLast())))"
        let payloads: [(String, JSON)] = [
            ("genuine", genuine),
            ("a forged transaction", replacing(genuine, "signedTransactionInfo", with: forgedTransaction)),
            ("a forged renewal", replacing(genuine, "signedRenewalInfo", with: forgedRenewal)),
            ("both forged", replacing(replacing(genuine, "signedTransactionInfo", with: forgedTransaction), "signedRenewalInfo", with: forgedRenewal)),
            ("another bundle and a forged transaction", replacing(signer.notificationPayload(bundleId: "com.other.app"), "signedTransactionInfo", with: forgedTransaction)),
            ("a transaction of another bundle and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: otherBundle), "signedRenewalInfo", with: forgedRenewal)),
            ("a transaction of another environment and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: otherEnvironment), "signedRenewalInfo", with: forgedRenewal)),
            ("a late transaction and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: late), "signedRenewalInfo", with: forgedRenewal)),
            ("a short signature and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: shortSignature), "signedRenewalInfo", with: forgedRenewal)),
            ("a transaction that is no JWS and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: "not.a-jws"), "signedRenewalInfo", with: forgedRenewal)),
            ("a transaction signed a day earlier", replacing(genuine, "signedTransactionInfo", with: earlier)),
            ("a transaction signed a day earlier and a forged renewal", replacing(replacing(genuine, "signedTransactionInfo", with: earlier), "signedRenewalInfo", with: forgedRenewal)),
            ("a transaction of another chain", replacing(genuine, "signedTransactionInfo", with: Self.rogue.sign(AppleSigner.transaction()))),
            ("Production without the app's appAppleId and a forged renewal", replacing(signer.notificationPayload(environment: "Production", appAppleId: 9999), "signedRenewalInfo", with: forger.sign(AppleSigner.renewalInfo(environment: "Production")))),
            ("Production", signer.notificationPayload(environment: "Production", transaction: AppleSigner.transaction(environment: "Production"), renewalInfo: AppleSigner.renewalInfo(environment: "Production"))),
            ("Xcode, which the app does not take", signer.notificationPayload(environment: "Xcode")),
            ("a summary", [
                "notificationType": "RENEWAL_EXTENSION", "subtype": "SUMMARY", "notificationUUID": "s-1", "signedDate": .integer(Fixtures.signedDate),
                "summary": ["bundleId": "com.example.app", "environment": "Sandbox", "appAppleId": 1234, "requestIdentifier": "r"],
            ]),
        ]
        var refusedReasons: Set<RejectReason> = []
        for (name, payload) in payloads {
            for body in [signer.body(payload), forger.body(payload), Self.rogue.body(payload)] {
                let expected = outcome(cold, body)
                #expect(outcome(warm, body).text == expected.text, "\(name)")
                if let refusal = expected.refusal { refusedReasons.insert(refusal) }
            }
        }
        // The warm verifier did check ahead, and the cases reach the faults they were made for.
        #expect((warm.signaturesAnsweredAhead > 0) == verifyNestedSignatures)
        for name in ["genuine", "a transaction signed a day earlier", "Production", "a summary"] {
            let payload = try #require(payloads.first { $0.0 == name }?.1)
            #expect(outcome(cold, signer.body(payload)).refusal == nil, "\(name)")
        }
        #expect(refusedReasons.isSuperset(of: [.badSignature, .wrongBundleId, .wrongEnvironment, .malformed, .wrongAppAppleId, .untrustedChain]))
        #expect(refusedReasons.contains(.certificateExpired) == verifyNestedSignatures)
    }
}
