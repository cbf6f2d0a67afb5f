import Foundation
import RelayCore
import RelayCrypto

/// The chain of an Apple JWS: built and trusted with OpenSSL, once per chain the cache does not hold.
extension AppleVerifier {
    /// The leaf's public key once the chain leaf → intermediate → a configured root is trusted at `time`,
    /// and the span of time in which every certificate of the chain is valid.
    func chainKey(leaf leafText: String, intermediate intermediateText: String, at time: Int64, what: String) throws(Rejection)
        -> (PublicKey, Range<Int64>)
    {
        // Canonical standard base64 only.
        guard let leafDER = Base64.decode(leafText.utf8, alphabet: .standard, padding: .required, canonical: true),
            let intermediateDER = Base64.decode(intermediateText.utf8, alphabet: .standard, padding: .required, canonical: true)
        else {
            throw Rejection(.malformed, "\(what) x5c is not canonical base64")
        }
        let leaf: Certificate
        let intermediate: Certificate
        do {
            leaf = try Certificate(der: leafDER)
            intermediate = try Certificate(der: intermediateDER)
        } catch {
            throw Rejection(.malformed, "\(what) x5c holds a certificate OpenSSL cannot parse")
        }
        let chain: [Certificate]
        switch trust.verify(leaf: leaf, intermediates: [intermediate], at: time) {
        case .success(let built): chain = built
        case .failure(.outsideValidity(let message)):
            throw Rejection(.certificateExpired, "\(what) chain is not valid at signedDate \(Self.iso8601(time)): \(message)")
        case .failure(.untrusted(let message)):
            throw Rejection(.untrustedChain, "\(what) chain does not lead to a configured root: \(message)")
        }
        // Exactly leaf → x5c[1] → root: OpenSSL may not skip or substitute the intermediate.
        guard chain.count == 3, chain[1].isSame(as: intermediate) else {
            throw Rejection(.untrustedChain, "\(what) chain must be leaf → x5c[1] → a configured root (OpenSSL built \(chain.count) certificates)")
        }
        guard leaf.hasExtension(oid: Self.leafOID) else {
            throw Rejection(.missingAppleOID, "\(what) leaf certificate lacks Apple's OID \(Self.leafOID)")
        }
        guard intermediate.hasExtension(oid: Self.intermediateOID) else {
            throw Rejection(.missingAppleOID, "\(what) intermediate certificate lacks Apple's OID \(Self.intermediateOID)")
        }
        let key: PublicKey
        do {
            key = try leaf.publicKey()
        } catch {
            throw Rejection(.malformed, "\(what) leaf certificate has no usable public key")
        }
        guard key.kind == .ecP256 else {
            throw Rejection(.unsupportedAlgorithm, "\(what) leaf key is \(key.kind), not the P-256 key ES256 needs")
        }
        // OpenSSL takes a certificate as valid from notBefore up to, not including, notAfter.
        let notBefore = chain.map(\.validity.lowerBound).max() ?? time
        let notAfter = chain.map(\.validity.upperBound).min() ?? time
        return (key, notBefore < notAfter ? notBefore..<notAfter : time..<time)
    }

    static func iso8601(_ seconds: Int64) -> String {
        Date(timeIntervalSince1970: TimeInterval(seconds)).formatted(.iso8601)
    }
}
