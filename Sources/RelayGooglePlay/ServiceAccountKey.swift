import Foundation
import RelayCore
import RelayCrypto

/// A Google service-account JSON key file (the one the Cloud console downloads): the fields the OAuth
/// JWT bearer grant needs. The private key is parsed once and only ever used to sign.
struct ServiceAccountKey: Sendable {
    /// `client_email`: the assertion's issuer.
    var clientEmail: String
    /// `private_key_id`: the assertion header's `kid`, when the file has one.
    var privateKeyId: String?
    /// `private_key`, an RSA key (RS256 is the only algorithm Google's token endpoint takes).
    var privateKey: PrivateKey

    /// Reads and validates the key file at `path`. Every failure names the file and the field; none
    /// repeats the file's contents.
    static func load(path: String) throws(StoreAPIError) -> ServiceAccountKey {
        let bytes: [UInt8]
        do {
            bytes = Array(try Data(contentsOf: URL(fileURLWithPath: path)))
        } catch {
            throw configuration("cannot read the service-account key file \(path) (\(error.localizedDescription)); check playApi.serviceAccountKey")
        }
        guard let document = try? JSON.parse(bytes), case .object = document else {
            throw configuration("the service-account key file \(path) is not a JSON object; use the JSON key downloaded from the Google Cloud console")
        }
        guard let type = document["type"]?.stringValue else {
            throw configuration("the service-account key file \(path) has no \"type\" string; use a service account's JSON key")
        }
        guard type == "service_account" else {
            throw configuration("the service-account key file \(path) has \"type\": \"\(type)\", expected \"service_account\"")
        }
        guard let clientEmail = document["client_email"]?.stringValue, !clientEmail.isEmpty else {
            throw configuration("the service-account key file \(path) has no \"client_email\"")
        }
        let privateKeyId: String?
        switch document["private_key_id"] {
        case nil, .null?: privateKeyId = nil
        case .string(let value)?: privateKeyId = value.isEmpty ? nil : value
        case _?: throw configuration("the service-account key file \(path) has a \"private_key_id\" that is not a string")
        }
        guard let pem = document["private_key"]?.stringValue, !pem.isEmpty else {
            throw configuration("the service-account key file \(path) has no \"private_key\"")
        }
        let privateKey: PrivateKey
        do {
            privateKey = try PrivateKey(pem: pem)
        } catch {
            // OpenSSL's messages name what failed, never the key material.
            throw configuration("\"private_key\" in the service-account key file \(path) is not a PEM private key (\(error))")
        }
        guard case .rsa = privateKey.publicKey.kind else {
            throw configuration("\"private_key\" in the service-account key file \(path) is not an RSA key; Google's token endpoint takes RS256 only")
        }
        return ServiceAccountKey(clientEmail: clientEmail, privateKeyId: privateKeyId, privateKey: privateKey)
    }

    private static func configuration(_ message: String) -> StoreAPIError {
        StoreAPIError(.play, kind: .configuration, message: message)
    }
}
