private import Glibc

/// The payload (middle part) of a compact JWS, decoded without verifying anything.
public enum JWSPayload {
    /// Found over the UTF-8 bytes: `String.split` walks Characters, which took a fifth of the relay's
    /// CPU in ingest on 12.7 KB Apple notifications (perf, `revenue-relay-bench e2e`).
    public static func decode(_ jws: String) -> JSON? {
        guard let bytes = payloadBytes(jws) else { return nil }
        return try? JSON.parse(bytes)
    }

    /// `decode`, building only the members named (`JSON.parse(_:keepingMembersNamed:)`): for a reader of a
    /// few members, such as the ingest's subject.
    public static func decode(_ jws: String, keepingMembersNamed names: JSON.MemberNames) -> JSON? {
        guard let bytes = payloadBytes(jws) else { return nil }
        return try? JSON.parse(bytes, keepingMembersNamed: names)
    }

    private static func payloadBytes(_ jws: String) -> [UInt8]? {
        var jws = jws
        return jws.withUTF8 { text in
            guard let (first, second) = dots(in: text) else { return nil }
            return Base64.decode(text[(first + 1)..<second], alphabet: .either, padding: .optional, canonical: false)
        }
    }

    /// Where the two dots of a compact serialization (`header.payload.signature`) are; nil unless it
    /// has exactly two. Inlinable so that the verifier's call is specialized for its bytes: it scans
    /// whole 12.7 KB notifications.
    @inlinable public static func dots<Bytes: Collection<UInt8>>(in bytes: Bytes) -> (first: Bytes.Index, second: Bytes.Index)? {
        // Contiguous bytes (the verifier's array, the ingest's buffer) are searched with memchr, many bytes at a
        // time: a byte-at-a-time search here was 1.7% of the relay's CPU at saturation (`perf`, the e2e bench).
        if let found = bytes.withContiguousStorageIfAvailable({ dotOffsets(in: $0) }) {
            guard let (first, second) = found else { return nil }
            return (bytes.index(bytes.startIndex, offsetBy: first), bytes.index(bytes.startIndex, offsetBy: second))
        }
        let dot = UInt8(ascii: ".")
        guard let first = bytes.firstIndex(of: dot) else { return nil }
        let afterFirst = bytes.index(after: first)
        guard let second = bytes[afterFirst...].firstIndex(of: dot), !bytes[bytes.index(after: second)...].contains(dot) else { return nil }
        return (first, second)
    }

    /// `dots(in:)` over contiguous bytes, as offsets.
    @usableFromInline static func dotOffsets(in bytes: UnsafeBufferPointer<UInt8>) -> (Int, Int)? {
        guard let base = bytes.baseAddress else { return nil }
        let dot = Int32(UInt8(ascii: "."))
        func find(from offset: Int) -> Int? {
            guard offset < bytes.count, let found = memchr(base + offset, dot, bytes.count - offset) else { return nil }
            return UnsafeRawPointer(found) - UnsafeRawPointer(base)
        }
        guard let first = find(from: 0), let second = find(from: first + 1), find(from: second + 1) == nil else { return nil }
        return (first, second)
    }
}

/// Base64 (RFC 4648), table-driven over bytes.
public enum Base64 {
    public enum Alphabet: Sendable {
        /// `+` and `/`.
        case standard
        /// `-` and `_` (base64url).
        case url
        /// Either, as received from anywhere.
        case either
    }

    public enum Padding: Sendable {
        case required
        case forbidden
        case optional
    }

    /// Lenient: either alphabet, padding optional, trailing bits ignored.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        decode(text.utf8, alphabet: .either, padding: .optional, canonical: false)
    }

    /// Decodes `input`. With `canonical`, the unused bits of the last character must be zero, so that
    /// exactly one text encodes each byte string (what a signature check over the text relies on).
    public static func decode(_ input: some Collection<UInt8>, alphabet: Alphabet, padding: Padding, canonical: Bool) -> [UInt8]? {
        if let result = input.withContiguousStorageIfAvailable({ decode(buffer: $0, alphabet: alphabet, padding: padding, canonical: canonical) }) {
            return result
        }
        return Array(input).withUnsafeBufferPointer { decode(buffer: $0, alphabet: alphabet, padding: padding, canonical: canonical) }
    }

    private static func decode(buffer: UnsafeBufferPointer<UInt8>, alphabet: Alphabet, padding: Padding, canonical: Bool) -> [UInt8]? {
        var length = buffer.count
        var padCount = 0
        while length > 0, buffer[length - 1] == UInt8(ascii: "="), padCount < 2 {
            length -= 1
            padCount += 1
        }
        let remainder = length % 4
        if remainder == 1 { return nil }
        switch padding {
        case .forbidden: if padCount > 0 { return nil }
        case .required: if (length + padCount) % 4 != 0 { return nil }
        case .optional: if padCount > 0, (length + padCount) % 4 != 0 { return nil }
        }
        let table: [UInt8]
        let quads: [UInt32]
        switch alphabet {
        case .standard: (table, quads) = (standardTable, standardQuads)
        case .url: (table, quads) = (urlTable, urlQuads)
        case .either: (table, quads) = (eitherTable, eitherQuads)
        }
        let outputCount = length / 4 * 3 + (remainder == 0 ? 0 : remainder - 1)
        return table.withUnsafeBufferPointer { table -> [UInt8]? in
            var valid = true
            let output = [UInt8](unsafeUninitializedCapacity: outputCount) { out, initialized in
                var index = 0
                var position = 0
                var bad: UInt8 = 0
                // Four characters at a time into a 24-bit value: each table holds a character's six bits
                // already in place for its position, and 0xFF000000 for a character outside the alphabet.
                // The three bytes are stored as one four-byte word (the fourth overwritten next) while a
                // whole word fits. A 9.7 KB payload took 10–30% less time than shifting each character's
                // bits (alternating runs in one process); the relay decodes about 40 KB per notification.
                quads.withUnsafeBufferPointer { quads in
                    guard let base = out.baseAddress else { return }
                    var invalid: UInt32 = 0
                    while index + 4 <= length {
                        let value =
                            quads[Int(buffer[index])] | quads[256 + Int(buffer[index + 1])]
                            | quads[512 + Int(buffer[index + 2])] | quads[768 + Int(buffer[index + 3])]
                        invalid |= value
                        if position + 4 <= outputCount {
                            UnsafeMutableRawPointer(base + position).storeBytes(of: (value << 8).bigEndian, as: UInt32.self)
                        } else {
                            base[position] = UInt8(truncatingIfNeeded: value >> 16)
                            base[position + 1] = UInt8(truncatingIfNeeded: value >> 8)
                            base[position + 2] = UInt8(truncatingIfNeeded: value)
                        }
                        index += 4
                        position += 3
                    }
                    if invalid & 0xFF00_0000 != 0 { bad = 0x80 }
                }
                if remainder == 2 {
                    let a = table[Int(buffer[index])], b = table[Int(buffer[index + 1])]
                    bad |= a | b
                    if canonical && b & 0x0F != 0 { valid = false }
                    out[position] = a << 2 | b >> 4
                    position += 1
                } else if remainder == 3 {
                    let a = table[Int(buffer[index])], b = table[Int(buffer[index + 1])], c = table[Int(buffer[index + 2])]
                    bad |= a | b | c
                    if canonical && c & 0x03 != 0 { valid = false }
                    out[position] = a << 2 | b >> 4
                    out[position + 1] = b << 4 | c >> 2
                    position += 2
                }
                // Invalid characters map to 0xFF, so any of them sets the top bit.
                if bad & 0x80 != 0 { valid = false }
                initialized = position
            }
            return valid ? output : nil
        }
    }

    /// Standard base64 with padding.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        encode(Array(bytes), characters: standardCharacters, pad: true)
    }

    /// Base64url without padding (RFC 7515 section 2), as JWS uses it.
    public static func encodeURL(_ bytes: some Collection<UInt8>) -> String {
        encode(Array(bytes), characters: urlCharacters, pad: false)
    }

    private static func encode(_ bytes: [UInt8], characters: [UInt8], pad: Bool) -> String {
        var output = [UInt8]()
        output.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            output.append(characters[Int(value >> 18 & 0x3F)])
            output.append(characters[Int(value >> 12 & 0x3F)])
            output.append(characters[Int(value >> 6 & 0x3F)])
            output.append(characters[Int(value & 0x3F)])
            index += 3
        }
        let left = bytes.count - index
        if left > 0 {
            let value = UInt32(bytes[index]) << 16 | (left == 2 ? UInt32(bytes[index + 1]) << 8 : 0)
            output.append(characters[Int(value >> 18 & 0x3F)])
            output.append(characters[Int(value >> 12 & 0x3F)])
            if left == 2 { output.append(characters[Int(value >> 6 & 0x3F)]) }
            if pad { output.append(contentsOf: Array(repeating: UInt8(ascii: "="), count: 3 - left)) }
        }
        return String(decoding: output, as: UTF8.self)
    }

    private static let standardCharacters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let urlCharacters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    private static func table(_ characters: [[UInt8]]) -> [UInt8] {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for alphabet in characters {
            for (value, character) in alphabet.enumerated() { table[Int(character)] = UInt8(value) }
        }
        return table
    }

    /// Four tables of 256 in one array: a character's value shifted to its place among four (18, 12, 6, 0
    /// bits), or 0xFF000000 when the alphabet lacks it.
    private static func quads(_ table: [UInt8]) -> [UInt32] {
        [18, 12, 6, 0].flatMap { shift in table.map { $0 == 0xFF ? 0xFF00_0000 : UInt32($0) << shift } }
    }

    private static let standardQuads = quads(standardTable)
    private static let urlQuads = quads(urlTable)
    private static let eitherQuads = quads(eitherTable)
    private static let standardTable = table([standardCharacters])
    private static let urlTable = table([urlCharacters])
    private static let eitherTable = table([standardCharacters, urlCharacters])
}

/// A Standard Webhooks endpoint secret: `whsec_` followed by base64 (the prefix is optional).
public enum WebhookSecret {
    /// The HMAC key the secret stands for, or nil when it is not base64 or empty. The configuration
    /// check and the signer both use this, so a secret the configuration accepts always signs.
    public static func key(_ secret: String) -> [UInt8]? {
        let encoded = secret.hasPrefix("whsec_") ? secret.dropFirst(6) : secret[...]
        guard let key = Base64.decode(encoded), !key.isEmpty else { return nil }
        return key
    }
}
