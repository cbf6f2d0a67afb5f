import COpenSSL

/// AES-256-GCM through OpenSSL: authenticated encryption of small values the relay hands to clients and
/// must get back unread and unchanged (a checkout's context). A new random 96-bit nonce each time.
public enum AESGCM {
    public static let keyLength = 32
    static let nonceLength = 12
    static let tagLength = 16

    /// `nonce ‖ ciphertext ‖ tag` of `plaintext` under `key` (32 bytes), `associatedData` authenticated too.
    public static func seal(_ plaintext: [UInt8], key: [UInt8], associatedData: [UInt8] = []) throws(OpenSSLError) -> [UInt8] {
        guard key.count == keyLength else { throw OpenSSLError(operation: "seal: the key is not 32 bytes", messages: []) }
        let nonce = try SecureRandom.bytes(nonceLength)
        guard let context = EVP_CIPHER_CTX_new() else { throw OpenSSLError.drain("seal: new cipher context") }
        defer { EVP_CIPHER_CTX_free(context) }
        var output = [UInt8](repeating: 0, count: plaintext.count + 16)
        var tag = [UInt8](repeating: 0, count: tagLength)
        var length: Int32 = 0
        var total = 0
        let ok = key.withUnsafeBufferPointer { key in
            nonce.withUnsafeBufferPointer { nonce -> Bool in
                guard EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nil, nil, nil) == 1,
                    EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceLength), nil) == 1,
                    EVP_EncryptInit_ex(context, nil, nil, key.baseAddress, nonce.baseAddress) == 1
                else { return false }
                if !associatedData.isEmpty {
                    let added = associatedData.withUnsafeBufferPointer { EVP_EncryptUpdate(context, nil, &length, $0.baseAddress, Int32($0.count)) }
                    guard added == 1 else { return false }
                }
                let updated = output.withUnsafeMutableBufferPointer { out in
                    plaintext.withUnsafeBufferPointer { input in
                        EVP_EncryptUpdate(context, out.baseAddress, &length, input.baseAddress ?? UnsafePointer(out.baseAddress), Int32(input.count))
                    }
                }
                guard updated == 1 else { return false }
                total = Int(length)
                let finished = output.withUnsafeMutableBufferPointer { out in EVP_EncryptFinal_ex(context, out.baseAddress! + total, &length) }
                guard finished == 1 else { return false }
                total += Int(length)
                return tag.withUnsafeMutableBufferPointer { EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(tagLength), $0.baseAddress) } == 1
            }
        }
        guard ok else { throw OpenSSLError.drain("seal") }
        return nonce + output.prefix(total) + tag
    }

    /// The plaintext of a `seal` result, or nil when it was not sealed under `key` with `associatedData`,
    /// or was changed (the tag does not verify).
    public static func open(_ sealed: [UInt8], key: [UInt8], associatedData: [UInt8] = []) -> [UInt8]? {
        guard key.count == keyLength, sealed.count >= nonceLength + tagLength else { return nil }
        let nonce = Array(sealed.prefix(nonceLength))
        var tag = Array(sealed.suffix(tagLength))
        let ciphertext = Array(sealed.dropFirst(nonceLength).dropLast(tagLength))
        guard let context = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(context) }
        var output = [UInt8](repeating: 0, count: ciphertext.count + 16)
        var length: Int32 = 0
        var total = 0
        let ok = key.withUnsafeBufferPointer { key in
            nonce.withUnsafeBufferPointer { nonce -> Bool in
                guard EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nil, nil, nil) == 1,
                    EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceLength), nil) == 1,
                    EVP_DecryptInit_ex(context, nil, nil, key.baseAddress, nonce.baseAddress) == 1
                else { return false }
                if !associatedData.isEmpty {
                    let added = associatedData.withUnsafeBufferPointer { EVP_DecryptUpdate(context, nil, &length, $0.baseAddress, Int32($0.count)) }
                    guard added == 1 else { return false }
                }
                let updated = output.withUnsafeMutableBufferPointer { out in
                    ciphertext.withUnsafeBufferPointer { input in
                        EVP_DecryptUpdate(context, out.baseAddress, &length, input.baseAddress ?? UnsafePointer(out.baseAddress), Int32(input.count))
                    }
                }
                guard updated == 1 else { return false }
                total = Int(length)
                guard tag.withUnsafeMutableBufferPointer({ EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, Int32(tagLength), $0.baseAddress) }) == 1
                else { return false }
                let finished = output.withUnsafeMutableBufferPointer { out in EVP_DecryptFinal_ex(context, out.baseAddress! + total, &length) }
                guard finished == 1 else { return false }
                total += Int(length)
                return true
            }
        }
        guard ok else {
            OpenSSLError.clearQueue()
            return nil
        }
        return Array(output.prefix(total))
    }
}

/// Cryptographically secure random bytes (OpenSSL's RAND_bytes).
public enum SecureRandom {
    public static func bytes(_ count: Int) throws(OpenSSLError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard count == 0 || bytes.withUnsafeMutableBufferPointer({ RAND_bytes($0.baseAddress, Int32(count)) }) == 1 else {
            throw OpenSSLError.drain("random bytes")
        }
        return bytes
    }
}
