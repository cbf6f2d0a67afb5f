import COpenSSL

/// Hashes and MACs through OpenSSL.
public enum Digest {
    /// HMAC-SHA256 of `message` keyed with `key`, or nil when OpenSSL refuses (never a zero MAC that
    /// a forged all-zero signature would match).
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8]? {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        // A zero-length key still needs a valid pointer.
        let keyBytes = key.isEmpty ? [0] : key
        let result = keyBytes.withUnsafeBytes { keyPointer in
            message.withUnsafeBufferPointer { message in
                output.withUnsafeMutableBufferPointer { out in
                    HMAC(EVP_sha256(), keyPointer.baseAddress, Int32(key.count), message.baseAddress, message.count, out.baseAddress, &length)
                }
            }
        }
        guard result != nil, length == 32 else {
            OpenSSLError.clearQueue()
            return nil
        }
        return output
    }

    /// SHA-256 of `message`, with the implementation OpenSSL fetched once (`SHA256()` looks it up by name on
    /// every call in OpenSSL 3.0).
    public static func sha256(_ message: [UInt8]) -> [UInt8] {
        message.withUnsafeBytes { sha256($0) }
    }

    /// SHA-256 of bytes borrowed from elsewhere (a JWS's signing input inside its text), not copied.
    public static func sha256(_ message: UnsafeRawBufferPointer) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let hashed = output.withUnsafeMutableBufferPointer {
            EVP_Digest(message.baseAddress, message.count, $0.baseAddress, &length, FetchedSHA256.md, nil) == 1
        }
        // Never a hash of zeros in its place: the console's signing key and the redemption codes' hashes are made
        // from it. (Hashing into a buffer of the right size fails only when OpenSSL itself is broken.)
        precondition(hashed && length == 32, "OpenSSL could not compute SHA-256")
        return output
    }

    /// Compares two byte strings in time that depends only on their lengths (CRYPTO_memcmp).
    public static func constantTimeEquals(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
        guard lhs.count == rhs.count else { return false }
        if lhs.isEmpty { return true }
        return lhs.withUnsafeBytes { a in rhs.withUnsafeBytes { b in CRYPTO_memcmp(a.baseAddress, b.baseAddress, a.count) == 0 } }
    }

    /// Lower-case hexadecimal.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}

/// An HMAC-SHA256 key prepared once for many messages (the webhook signer's endpoint secrets). Owns
/// its OpenSSL context; signing only reads it, so one key may sign on many threads at once.
public final class HMACSHA256Key: @unchecked Sendable {
    private let keyed: OpaquePointer

    /// Nil when OpenSSL cannot set the key up.
    public init?(_ key: [UInt8]) {
        guard let keyed = key.withUnsafeBufferPointer({ relay_hmac_sha256_keyed($0.baseAddress, $0.count) }) else {
            OpenSSLError.clearQueue()
            return nil
        }
        self.keyed = keyed
    }

    deinit { EVP_MAC_CTX_free(keyed) }

    /// HMAC-SHA256 of `prefix` followed by `message` (no concatenated copy), or nil when OpenSSL fails.
    public func code(prefix: [UInt8], message: [UInt8]) -> [UInt8]? {
        var output = [UInt8](repeating: 0, count: 32)
        let ok = prefix.withUnsafeBufferPointer { prefix in
            message.withUnsafeBufferPointer { message in
                output.withUnsafeMutableBufferPointer { out in
                    relay_hmac_sha256_sign(keyed, prefix.baseAddress, prefix.count, message.baseAddress, message.count, out.baseAddress)
                }
            }
        }
        guard ok == 1 else {
            OpenSSLError.clearQueue()
            return nil
        }
        return output
    }
}

/// SHA-256's implementation, fetched from OpenSSL's default provider once for the process and kept for its life.
enum FetchedSHA256 {
    nonisolated(unsafe) static let md: OpaquePointer = {
        guard let md = EVP_MD_fetch(nil, "SHA256", nil) else { fatalError("OpenSSL's default provider has no SHA-256") }
        return md
    }()
}
