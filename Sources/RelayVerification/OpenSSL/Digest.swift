import COpenSSL

/// Hashes and MACs through OpenSSL.
public enum Digest {
    /// SHA-256 of `data`.
    public static func sha256(_ data: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        data.withUnsafeBytes { input in
            output.withUnsafeMutableBufferPointer { out in
                _ = SHA256(input.baseAddress?.assumingMemoryBound(to: UInt8.self), input.count, out.baseAddress)
            }
        }
        return output
    }

    /// HMAC-SHA256 of `message` keyed with `key`.
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        key.withUnsafeBytes { key in
            message.withUnsafeBytes { message in
                output.withUnsafeMutableBufferPointer { out in
                    // A zero-length key needs a non-null pointer.
                    var empty: UInt8 = 0
                    let keyPointer = key.baseAddress ?? withUnsafePointer(to: &empty) { UnsafeRawPointer($0) }
                    _ = HMAC(
                        EVP_sha256(), keyPointer, Int32(key.count), message.baseAddress?.assumingMemoryBound(to: UInt8.self),
                        message.count, out.baseAddress, &length)
                }
            }
        }
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
