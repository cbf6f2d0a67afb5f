import Foundation
import RelayConfig
import RelayCore
import RelayDelivery
import RelayTestSupport
import Testing

@Suite struct WebhookSignerTests {
    /// Standard Webhooks' own test vectors (github.com/standard-webhooks/standard-webhooks, MIT): the
    /// "sign function works" case of every reference library, and the Rust library's.
    static let embedded: [(secret: String, id: String, timestamp: Int64, body: String, signature: String)] = [
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, #"{"test": 2432232314}"#,
         "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        ("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1_649_367_553,
         #"{"email":"test@example.com","username":"test_user"}"#, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="),
    ]

    @Test func reproducesTheOfficialVectors() throws {
        for vector in Self.embedded {
            let signer = try WebhookSigner(secrets: [vector.secret])
            #expect(signer.signature(id: vector.id, timestamp: vector.timestamp, body: Array(vector.body.utf8)) == vector.signature)
        }
    }

    @Test
    func reproducesEveryFixedVectorInSharedVectors() throws {
        let file = try #require(Fixtures.sharedVectors).appendingPathComponent("standard-webhooks/vectors.json")
        let document = try JSON.parse(Array(try Data(contentsOf: file)))
        var checked = 0
        for vector in document["vectors"]?.arrayValue ?? [] {
            guard let expected = vector["expected_signature"]?.stringValue, let secret = vector["secret"]?.stringValue,
                let id = vector["webhook_id"]?.stringValue, let timestamp = vector["webhook_timestamp"]?.stringValue.flatMap({ Int64($0) }),
                let payload = vector["payload"]?.stringValue
            else { continue }
            let signer = try WebhookSigner(secrets: [secret])
            #expect(signer.signature(id: id, timestamp: timestamp, body: Array(payload.utf8)) == expected, "\(vector["name"]?.text ?? "")")
            checked += 1
        }
        #expect(checked >= 2)
    }

    @Test func everySecretSignsDuringRotationAndTheSvixAliasesMatch() throws {
        let old = Self.embedded[0]
        let new = Self.embedded[1]
        let signer = try WebhookSigner(secrets: [old.secret, new.secret])
        let body = Array(old.body.utf8)
        let headers = Dictionary(uniqueKeysWithValues: signer.headers(id: old.id, timestamp: old.timestamp, body: body).map { ($0.name, $0.value) })
        let signatures = try #require(headers["webhook-signature"]).split(separator: " ").map(String.init)
        #expect(signatures.count == 2)
        #expect(signatures.first == old.signature)
        #expect(signatures.last == (try WebhookSigner(secrets: [new.secret])).signature(id: old.id, timestamp: old.timestamp, body: body))
        #expect(headers["webhook-id"] == old.id)
        #expect(headers["webhook-timestamp"] == "1614265330")
        #expect(headers["svix-id"] == headers["webhook-id"])
        #expect(headers["svix-timestamp"] == headers["webhook-timestamp"])
        #expect(headers["svix-signature"] == headers["webhook-signature"])
    }

    @Test func aSecretThatIsNotBase64IsRefusedWithoutEchoingIt() {
        #expect(throws: WebhookSigner.SecretError.self) { try WebhookSigner(secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!"]) }
        do {
            _ = try WebhookSigner(secrets: ["whsec_not*base64"])
        } catch {
            #expect(!error.description.contains("not*base64"))
        }
    }
}

@Suite struct AddressPolicyTests {
    @Test(arguments: [
        "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254", "100.64.0.1",
        "100.127.255.255", "0.0.0.0", "224.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.0.170",
        "::1", "::", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "fe80::1", "fe80::1%eth0", "fd00:ec2::254", "fc00::1", "ff02::1",
        "64:ff9b::a9fe:a9fe", "2001:db8::1", "not-an-ip", "",
    ])
    func nonPublicAddressesAreRefused(_ address: String) {
        #expect(AddressPolicy.refusal(address) != nil, "\(address) must be refused")
    }

    @Test(arguments: ["93.184.216.34", "8.8.8.8", "172.32.0.1", "100.128.0.1", "169.255.0.1", "2606:2800:220:1::1", "::ffff:8.8.8.8", "64:ff9b::808:808"])
    func publicAddressesAreAllowed(_ address: String) {
        #expect(AddressPolicy.refusal(address) == nil, "\(address) must be allowed")
    }
}
