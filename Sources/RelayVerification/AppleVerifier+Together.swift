import RelayCrypto

/// A notification's signatures checked together, ahead of their turns (docs/verification.md, *A
/// notification's signatures, checked together*).
extension AppleVerifier {
    /// A signature checked ahead of its turn (`checkAhead`), with the key and time it was checked at (its
    /// turn takes the answer only at the same time: a guard against pairing it with another JWS).
    struct CheckedAhead {
        let key: PublicKey
        let time: Int64
        let valid: Bool
    }

    /// The signatures of the leading run of `tokens` (the notification's own first) whose chains the cache
    /// holds, with their keys' tables, at their `signedDate`s, checked together (`PublicKey.verifyES256(_:)`:
    /// one inversion for all, about 10 µs less for each after the first), when the run has two or more. The
    /// run stops at the first token that is missing, unsigned or not in the cache, so that no signature is
    /// checked beyond one whose turn may refuse the notification before theirs.
    ///
    /// Nothing is decided here: each token's `verify` still takes every step in its turn and in the same
    /// order, and uses its result in place of checking the signature there. So a notification is refused
    /// for the same first fault as before, whatever the others hold. The cost falls on a notification with
    /// a signature forged under a header Apple's key signed before: the signatures after it in the run
    /// were checked too (for a forged outer one, three verifications' work together instead of one).
    func checkAhead(_ tokens: [(jws: CompactJWS, claimedEnvironment: String?)?]) -> [CheckedAhead?] {
        var ahead = [CheckedAhead?](repeating: nil, count: tokens.count)
        var found: [(index: Int, jws: CompactJWS, key: PublicKey, time: Int64)] = []
        for (index, token) in tokens.enumerated() {
            guard let (jws, claimed) = token, jws.signature.count == 64, !(claimed.map(Self.unsignedEnvironments.contains) ?? false),
                let time = try? Self.signedTime(of: jws, what: ""),
                let key = jws.withHeaderSegment({ cache.lookup($0, at: time) }), key.hasFixedBaseTable
            else { break }
            found.append((index, jws, key, time))
        }
        // One alone gains nothing: its turn checks it the same way.
        guard found.count > 1 else { return ahead }
        let checks = found.map { ES256Check(key: $0.key, digest: $0.jws.withSigningInput { Digest.sha256($0) }, rawSignature: $0.jws.signature) }
        for (token, valid) in zip(found, PublicKey.verifyES256(checks)) {
            ahead[token.index] = CheckedAhead(key: token.key, time: token.time, valid: valid)
        }
        return ahead
    }
}
