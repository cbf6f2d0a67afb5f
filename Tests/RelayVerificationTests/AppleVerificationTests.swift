import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
import RelayVerification
import Testing

@Suite struct AppleVerificationTests {
    let signer = AppleSigner()

    @Test func acceptsASignedNotificationAndDecodesTheNestedJWSs() async throws {
        let verdict = try await verdict(.apple, signer.body(signer.notificationPayload()))
        let notification = try #require(verdict.notification, "\(verdict)")
        #expect(notification.type == "SUBSCRIBED")
        #expect(notification.subtype == "INITIAL_BUY")
        #expect(notification.environment == "Sandbox")
        #expect(notification.notificationId == "5b6d8e2c-1f0a-4c1e-9a57-3f2f0b6a9c11")
        #expect(notification.payload["data"]?["signedTransactionInfo"]?["originalTransactionId"] == "2000000123456789")
        #expect(notification.payload["data"]?["signedRenewalInfo"]?["autoRenewStatus"] == 1)
    }

    @Test func acceptsProductionWithTheConfiguredAppAppleId() async throws {
        let body = signer.body(signer.notificationPayload(environment: "Production", appAppleId: 1234))
        #expect(try await reason(verdict(.apple, body)) == nil)
    }

    @Test func handlesTheSummaryExternalPurchaseTokenAndAppDataForms() async throws {
        let base: [String: JSON] = ["notificationUUID": "u", "version": "2.0", "signedDate": .integer(Fixtures.signedDate)]
        func payload(_ type: String, _ section: String, _ body: JSON) -> JSON {
            var members = base
            members["notificationType"] = .string(type)
            members[section] = body
            return .object(members)
        }
        let summary = payload(
            "RENEWAL_EXTENSION", "summary",
            ["environment": "Sandbox", "appAppleId": 1234, "bundleId": "com.example.app", "succeededCount": 5, "failedCount": 2])
        let sandboxToken = payload(
            "EXTERNAL_PURCHASE_TOKEN", "externalPurchaseToken",
            ["externalPurchaseId": "SANDBOX_b2158121", "tokenCreationDate": 1, "appAppleId": 1234, "bundleId": "com.example.app"])
        let productionToken = payload(
            "EXTERNAL_PURCHASE_TOKEN", "externalPurchaseToken",
            ["externalPurchaseId": "b2158121", "tokenCreationDate": 1, "appAppleId": 55555, "bundleId": "com.example.app"])
        let appData = payload(
            "RESCIND_CONSENT", "appData", ["environment": "Sandbox", "appAppleId": 1234, "bundleId": "com.example.app"])

        #expect(try await verdict(.apple, signer.body(summary)).notification?.environment == "Sandbox")
        #expect(try await verdict(.apple, signer.body(sandboxToken)).notification?.environment == "Sandbox")
        #expect(try await verdict(.apple, signer.body(appData)).notification?.type == "RESCIND_CONSENT")
        // No SANDBOX prefix means Production, where the appAppleId must match (1234 here).
        #expect(try await reason(verdict(.apple, signer.body(productionToken))) == .wrongAppAppleId)
    }

    @Test func keepsUnknownTypesRaw() async throws {
        var payload = signer.notificationPayload(type: "SOMETHING_NEW_2027", subtype: "SHINY")
        if case .object(var members) = payload {
            members["futureField"] = ["nested": [1, 2, 3]]
            payload = .object(members)
        }
        let notification = try #require(try await verdict(.apple, signer.body(payload)).notification)
        #expect(notification.type == "SOMETHING_NEW_2027")
        #expect(notification.payload["futureField"]?["nested"] == [1, 2, 3])
    }

    // MARK: Structure and algorithm

    @Test func rejectsBodiesThatAreNotAnAppleJWS() async throws {
        for body in [#"{"other": 1}"#, #"{"signedPayload": 5}"#, #"{"signedPayload": "a.b"}"#, #"{"signedPayload": "a.b.c.d"}"#, "[1]"] {
            #expect(try await reason(verdict(.apple, Array(body.utf8))) == .malformed, "\(body)")
        }
    }

    @Test(arguments: ["none", "HS256", "ES384", "RS256"])
    func rejectsEveryAlgorithmButES256(_ algorithm: String) async throws {
        var forged = signer
        forged.header = ["alg": .string(algorithm), "x5c": .array(signer.chain.map(JSON.string))]
        #expect(try await reason(verdict(.apple, forged.body(signer.notificationPayload()))) == .unsupportedAlgorithm)
        // An unsigned "alg: none" token with an empty signature is refused the same way.
        let header = Base64.encodeURL(JSON.object(["alg": .string(algorithm)]).serialized())
        let payload = Base64.encodeURL(signer.notificationPayload().serialized())
        let unsigned = JSON.object(["signedPayload": .string("\(header).\(payload).")]).serialized()
        #expect(try await reason(verdict(.apple, unsigned)) == .unsupportedAlgorithm)
    }

    @Test func requiresExactlyThreeCertificatesInX5c() async throws {
        for chain in [[], ["apple/leaf.pem"], ["apple/leaf.pem", "apple/intermediate.pem"], Fixtures.appleChain + ["apple/root.pem"]] {
            let short = AppleSigner(chain: chain)
            #expect(try await reason(verdict(.apple, short.body(signer.notificationPayload()))) == .malformed, "\(chain.count) certificates")
        }
        var missing = signer
        missing.header = ["alg": "ES256", "x5cwrong": .array(signer.chain.map(JSON.string))]
        #expect(try await reason(verdict(.apple, missing.body(signer.notificationPayload()))) == .malformed)
    }

    @Test func requiresSignedDate() async throws {
        #expect(try await reason(verdict(.apple, signer.body(signer.notificationPayload(signedDate: nil)))) == .malformed)
        // Dates beyond Int64 are refused, not a crash, before any cryptography.
        for date: JSON in [1e300, -1e30, "2030-01-01"] {
            var payload = signer.notificationPayload()
            if case .object(var members) = payload {
                members["signedDate"] = date
                payload = .object(members)
            }
            #expect(try await reason(verdict(.apple, signer.body(payload))) == .malformed, "\(date)")
        }
    }

    // MARK: Chain

    @Test func rejectsAChainToAnotherRoot() async throws {
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
        #expect(try await reason(verdict(.apple, rogue.body(rogue.notificationPayload()))) == .untrustedChain)
    }

    @Test func neverTrustsX5cTwo() async throws {
        // A trusted root in x5c[2] does not make a rogue chain trusted...
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/root.pem"])
        #expect(try await reason(verdict(.apple, rogue.body(rogue.notificationPayload()))) == .untrustedChain)
        // ...and any certificate in x5c[2] is ignored when the chain leads to a configured root.
        let substituted = AppleSigner(chain: ["apple/leaf.pem", "apple/intermediate.pem", "apple/rogue-root.pem"])
        #expect(try await reason(verdict(.apple, substituted.body(substituted.notificationPayload()))) == nil)
    }

    @Test func rejectsALeafThatSkipsTheIntermediate() async throws {
        let direct = AppleSigner(chain: ["apple/leaf-from-root.pem", "apple/intermediate.pem", "apple/root.pem"])
        #expect(try await reason(verdict(.apple, direct.body(direct.notificationPayload()))) == .untrustedChain)
    }

    @Test func checksValidityAtSignedDate() async throws {
        let year2050: Int64 = 2_524_608_000_000
        let year2023: Int64 = 1_672_531_200_000
        for date in [year2050, year2023] {
            let payload = signer.notificationPayload(
                signedDate: date, transaction: AppleSigner.transaction(signedDate: date), renewalInfo: AppleSigner.renewalInfo(signedDate: date))
            #expect(try await reason(verdict(.apple, signer.body(payload))) == .certificateExpired)
        }
        let expired = AppleSigner(chain: ["apple/leaf-expired.pem", "apple/intermediate.pem", "apple/root.pem"])
        #expect(try await reason(verdict(.apple, expired.body(expired.notificationPayload()))) == .certificateExpired)
    }

    @Test func aCachedChainServesOnlyDatesWithinItsValidity() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        let expired = AppleSigner(chain: ["apple/leaf-expired.pem", "apple/intermediate.pem", "apple/root.pem"])
        let inside: Int64 = 1_719_792_000_000  // 2024-07-01, within the expired leaf's 2024 validity
        let early = expired.notificationPayload(
            signedDate: inside, transaction: AppleSigner.transaction(signedDate: inside), renewalInfo: AppleSigner.renewalInfo(signedDate: inside))
        #expect(try await reason(verdict(.apple, expired.body(early), verifier: verifier)) == nil)
        // The same chain, now cached, must not vouch for a date after the leaf expired, nor for its
        // notAfter second itself (OpenSSL's validity ends there).
        #expect(try await reason(verdict(.apple, expired.body(expired.notificationPayload()), verifier: verifier)) == .certificateExpired)
        let notAfter: Int64 = 1_735_689_599_000  // 2024-12-31T23:59:59Z
        let edge = expired.notificationPayload(
            signedDate: notAfter, transaction: AppleSigner.transaction(signedDate: notAfter), renewalInfo: AppleSigner.renewalInfo(signedDate: notAfter))
        #expect(try await reason(verdict(.apple, expired.body(edge), verifier: verifier)) == .certificateExpired)
        #expect(try await reason(verdict(.apple, expired.body(edge))) == .certificateExpired, "and so says OpenSSL without the cache")
    }

    @Test func requiresApplesOIDs() async throws {
        let leaf = AppleSigner(chain: ["apple/leaf-no-oid.pem", "apple/intermediate.pem", "apple/root.pem"])
        #expect(try await reason(verdict(.apple, leaf.body(leaf.notificationPayload()))) == .missingAppleOID)
        let intermediate = AppleSigner(chain: ["apple/leaf-under-intermediate-no-oid.pem", "apple/intermediate-no-oid.pem", "apple/root.pem"])
        #expect(try await reason(verdict(.apple, intermediate.body(intermediate.notificationPayload()))) == .missingAppleOID)
    }

    // MARK: Signature

    @Test func rejectsAPayloadSignedByAnotherKey() async throws {
        var other = signer
        other.key = Fixtures.privateKey("apple/rogue-leaf.key")
        #expect(try await reason(verdict(.apple, other.body(signer.notificationPayload()))) == .badSignature)
    }

    @Test func rejectsNonCanonicalBase64() async throws {
        // The last character of a 64-byte signature carries 2 bits; the other 4 must be zero. Setting
        // them leaves the decoded bytes unchanged, so only a canonical-encoding check can catch it.
        let jws = signer.sign(signer.notificationPayload())
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let last = jws.last!
        let value = alphabet.firstIndex(of: last)!
        let malleable = String(jws.dropLast()) + String(alphabet[value | 0x0F])
        #expect(malleable != jws)
        #expect(Base64.decode(String(malleable.split(separator: ".")[2])) == Base64.decode(String(jws.split(separator: ".")[2])))
        let body = JSON.object(["signedPayload": .string(malleable)]).serialized()
        #expect(try await reason(verdict(.apple, body)) == .malformed)
    }

    @Test func rejectsTamperingWithAnyByte() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        let test: JSON = [
            "notificationType": "TEST", "notificationUUID": "u-1", "signedDate": .integer(Fixtures.signedDate),
            "data": ["bundleId": "com.example.app", "environment": "Sandbox", "appAppleId": 1234],
        ]
        let body = signer.body(test)
        #expect(try await reason(verdict(.apple, body, verifier: verifier)) == nil)
        var accepted: [Int] = []
        for index in body.indices {
            var tampered = body
            tampered[index] = body[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            if try await verdict(.apple, tampered, verifier: verifier).notification != nil { accepted.append(index) }
        }
        #expect(accepted.isEmpty, "tampered bytes accepted at \(accepted)")
    }

    // MARK: Business checks

    @Test func checksBundleEnvironmentAndAppAppleId() async throws {
        #expect(try await reason(verdict(.apple, signer.body(signer.notificationPayload(bundleId: "com.other.app")))) == .wrongBundleId)
        let production = try NotificationVerifier(configuration: Fixtures.configuration(environments: ["Production"]), logger: testLogger())
        #expect(try await reason(verdict(.apple, signer.body(signer.notificationPayload()), verifier: production)) == .wrongEnvironment)
        let wrongId = signer.body(signer.notificationPayload(environment: "Production", appAppleId: 9999))
        #expect(try await reason(verdict(.apple, wrongId)) == .wrongAppAppleId)
        let missingId = signer.body(signer.notificationPayload(environment: "Production", appAppleId: nil))
        #expect(try await reason(verdict(.apple, missingId)) == .wrongAppAppleId)
        // Sandbox does not check appAppleId; Production needs it configured.
        #expect(try await reason(verdict(.apple, signer.body(signer.notificationPayload(appAppleId: 9999)))) == nil)
        // Accepting Production without an appAppleId is refused when the configuration loads.
        #expect(throws: ConfigurationError.self) { try Fixtures.configuration(appAppleId: nil) }
    }

    /// The nested JWSs are part of what the notification's signature covers: changing any of their bytes after
    /// Apple signed is a bad signature, whatever else they carry, also where that signature alone vouches for them
    /// (`verifyNestedSignatures: false`).
    @Test func aNestedJWSChangedAfterTheNotificationWasSignedIsABadSignature() async throws {
        let vouching = try NotificationVerifier(configuration: Fixtures.configuration(verifyNestedSignatures: false), logger: testLogger())
        let signed = signer.notificationPayload()
        let parts = signer.sign(signed).split(separator: ".").map(String.init)
        guard case .object(var members) = signed, case .object(let data) = members["data"] else { Issue.record("no data"); return }
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
        let forgeries: [(String, JSON)] = [
            ("signedTransactionInfo", .string(rogue.sign(AppleSigner.transaction(originalTransactionId: "2000000999999999")))),
            ("signedTransactionInfo", .string(signer.sign(AppleSigner.transaction(originalTransactionId: "2000000999999999")))),
            ("signedRenewalInfo", .string(signer.sign(["autoRenewStatus": 0, "signedDate": .integer(Fixtures.signedDate), "environment": "Sandbox"]))),
        ]
        for (key, forged) in forgeries {
            var changed = data
            changed[key] = forged
            members["data"] = JSON.object(changed)
            let tampered = "\(parts[0]).\(Base64.encodeURL(JSON.object(members).serialized())).\(parts[2])"
            let body = JSON.object(["signedPayload": .string(tampered)]).serialized()
            #expect(try await reason(verdict(.apple, body, verifier: vouching)) == .badSignature)
            #expect(try await reason(verdict(.apple, body)) == .badSignature)
        }
        // The genuine parts, put back together, verify.
        members["data"] = JSON.object(data)
        let rebuilt = "\(parts[0]).\(Base64.encodeURL(JSON.object(members).serialized())).\(parts[2])"
        #expect(try await reason(verdict(.apple, JSON.object(["signedPayload": .string(rebuilt)]).serialized(), verifier: vouching)) == nil)
    }

    /// The nested JWSs' own chains and signatures are verified, as the design requires; with
    /// `verifyNestedSignatures: false` what the notification's signer signed is taken as it is.
    @Test func verifiesTheNestedJWSsOwnSignaturesUnlessConfiguredOff() async throws {
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
        let strict = try NotificationVerifier(configuration: Fixtures.configuration(verifyNestedSignatures: true), logger: testLogger())
        let lenient = try NotificationVerifier(configuration: Fixtures.configuration(verifyNestedSignatures: false), logger: testLogger())
        var payload = signer.notificationPayload()
        func replacing(_ key: String, with value: String) -> JSON {
            guard case .object(var members) = payload, case .object(var data) = members["data"] else { return payload }
            data[key] = .string(value)
            members["data"] = .object(data)
            return .object(members)
        }
        // The notification's signer signed a transaction of another chain, and renewal info whose payload was changed
        // after its own signature.
        payload = replacing("signedTransactionInfo", with: rogue.sign(AppleSigner.transaction()))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: strict)) == .untrustedChain)
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: lenient)) == nil)
        #expect(try await reason(verdict(.apple, signer.body(payload))) == .untrustedChain)

        payload = signer.notificationPayload()
        let genuine = signer.sign(AppleSigner.renewalInfo())
        let parts = genuine.split(separator: ".")
        let forgedPayload = Base64.encodeURL(JSON.object(["autoRenewStatus": 0, "signedDate": .integer(Fixtures.signedDate), "environment": "Sandbox"]).serialized())
        payload = replacing("signedRenewalInfo", with: "\(parts[0]).\(forgedPayload).\(parts[2])")
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: strict)) == .badSignature)
        #expect(try await reason(verdict(.apple, signer.body(payload))) == .badSignature)
        let accepted = try #require(try await verdict(.apple, signer.body(payload), verifier: lenient).notification)
        #expect(accepted.payload["data"]?["signedRenewalInfo"]?["autoRenewStatus"] == 0)

        // Vouched for, a nested JWS's header and signature are not read at all: a header `{}` and a signature that
        // is not one pass; verified, the header names no algorithm.
        let bare = "\(Base64.encodeURL(Array("{}".utf8))).\(Base64.encodeURL(AppleSigner.transaction().serialized())).sig"
        payload = replacing("signedTransactionInfo", with: bare)
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: strict)) == .unsupportedAlgorithm)
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: lenient)) == nil)
    }

    /// The nested JWSs' claims are checked whether or not their signatures are.
    @Test(arguments: [false, true])
    func checksTheNestedJWSsClaims(verifyingTheirSignatures: Bool) async throws {
        let verifier = try NotificationVerifier(
            configuration: Fixtures.configuration(verifyNestedSignatures: verifyingTheirSignatures), logger: testLogger())
        func replacing(_ key: String, with value: String) -> JSON {
            let payload = signer.notificationPayload()
            guard case .object(var members) = payload, case .object(var data) = members["data"] else { return payload }
            data[key] = .string(value)
            members["data"] = .object(data)
            return .object(members)
        }
        var payload = signer.notificationPayload(transaction: AppleSigner.transaction(environment: "Production"))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .wrongEnvironment)
        payload = signer.notificationPayload(transaction: AppleSigner.transaction(bundleId: "com.other.app"))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .wrongBundleId)
        payload = replacing("signedRenewalInfo", with: signer.sign(["autoRenewStatus": 1, "environment": "Production", "signedDate": .integer(Fixtures.signedDate)]))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .wrongEnvironment)
        payload = replacing("signedTransactionInfo", with: "signed_transaction_info_value")
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .malformed)
        payload = replacing("signedRenewalInfo", with: signer.sign(["autoRenewStatus": 1, "environment": "Sandbox"]))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .malformed)
        payload = replacing("signedRenewalInfo", with: signer.sign(["autoRenewStatus": 1, "environment": "Sandbox", "signedDate": "yesterday"]))
        #expect(try await reason(verdict(.apple, signer.body(payload), verifier: verifier)) == .malformed)
        #expect(try await reason(verdict(.apple, signer.body(signer.notificationPayload()), verifier: verifier)) == nil)
    }

    @Test func acceptsUnsignedXcodeDataOnlyWhenListed() async throws {
        let header = Base64.encodeURL(JSON.object(["alg": "ES256", "kid": "Apple_Xcode_Key"]).serialized())
        func unsigned(_ payload: JSON) -> String { "\(header).\(Base64.encodeURL(payload.serialized())).c2ln" }
        let transaction = unsigned(AppleSigner.transaction(environment: "Xcode"))
        let payload: JSON = [
            "notificationType": "SUBSCRIBED", "notificationUUID": "x", "signedDate": .integer(Fixtures.signedDate),
            "data": ["bundleId": "com.example.app", "environment": "Xcode", "signedTransactionInfo": .string(transaction)],
        ]
        let body = JSON.object(["signedPayload": .string(unsigned(payload))]).serialized()
        #expect(try await reason(verdict(.apple, body)) == .wrongEnvironment)
        let xcode = try NotificationVerifier(configuration: Fixtures.configuration(environments: ["Sandbox", "Xcode"]), logger: testLogger())
        #expect(try await reason(verdict(.apple, body, verifier: xcode)) == nil)
    }
}
