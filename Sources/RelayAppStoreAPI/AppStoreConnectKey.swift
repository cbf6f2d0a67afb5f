import Foundation
import RelayCrypto

/// An App Store Connect In-App Purchase API key (App Store Connect → Users and Access → Integrations →
/// In-App Purchase): the `.p8` private key (PKCS#8 PEM, EC P-256), its key id, the team's issuer id,
/// and the app's bundle id the tokens are for. The key is parsed once and only ever used to sign.
///
/// `description` names the ids only, so logging a key never prints its material.
public struct AppStoreConnectKey: Sendable, CustomStringConvertible {
    /// The key's id (`kid` of the token header), 10 characters in App Store Connect.
    public let keyId: String
    /// The issuer id of the team (`iss`), a UUID shown above the keys list.
    public let issuerId: String
    /// The app's bundle id (`bid`): Apple answers only about this app's transactions.
    public let bundleId: String
    let privateKey: PrivateKey

    /// A key from the `.p8` file's text. Ids are trimmed of surrounding whitespace (a pasted or
    /// `$(cat …)` value often ends in a newline); an empty one is a configuration error.
    public init(pem: String, keyId: String, issuerId: String, bundleId: String) throws(AppStoreAPIError) {
        func required(_ value: String, _ name: String, _ hint: String) throws(AppStoreAPIError) -> String {
            let trimmed = value.trimmingCharacters(in: .whitespacesAndNewlines)
            guard !trimmed.isEmpty else { throw AppStoreAPIError(.configuration, "the App Store Connect \(name) is empty; \(hint)") }
            return trimmed
        }
        self.keyId = try required(keyId, "key id", "copy it from the In-App Purchase key's row in App Store Connect")
        self.issuerId = try required(issuerId, "issuer id", "copy it from the top of App Store Connect's In-App Purchase keys page")
        self.bundleId = try required(bundleId, "bundle id", "set the app's bundle id")
        let key: PrivateKey
        do {
            key = try PrivateKey(pem: pem)
        } catch {
            // OpenSSL's messages name what failed, never the key material.
            throw AppStoreAPIError(
                .configuration,
                "the private key of App Store Connect key \(self.keyId) is not a PEM private key (\(error)); use the .p8 file App Store Connect downloaded")
        }
        guard case .ecP256 = key.publicKey.kind else {
            throw AppStoreAPIError(
                .configuration,
                "the private key of App Store Connect key \(self.keyId) is not an EC P-256 key; the App Store Server API takes ES256 tokens"
                    + " signed with the .p8 key from App Store Connect")
        }
        self.privateKey = key
    }

    /// Reads the `.p8` file at `path`. Failures name the file, never its contents.
    public static func load(path: String, keyId: String, issuerId: String, bundleId: String) throws(AppStoreAPIError) -> AppStoreConnectKey {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw AppStoreAPIError(
                .configuration, "cannot read the App Store Connect private key file \(path) (\(error.localizedDescription)); check the path and its permissions")
        }
        do {
            return try AppStoreConnectKey(pem: text, keyId: keyId, issuerId: issuerId, bundleId: bundleId)
        } catch {
            throw AppStoreAPIError(error.kind, error.message + " (file \(path))")
        }
    }

    public var description: String { "App Store Connect key \(keyId) (issuer \(issuerId), bundle \(bundleId))" }
}
