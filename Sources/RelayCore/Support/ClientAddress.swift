import Foundation
import Glibc

/// An IPv4 or IPv6 address range in CIDR notation (`17.0.0.0/8`, `2001:db8::/32`); a bare address is a
/// range of one. IPv4 addresses are kept as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), so `17.0.0.0/8` also
/// contains a peer the server sees as `::ffff:17.1.2.3`.
public struct AddressRange: Sendable, Hashable, CustomStringConvertible {
    private let network: [UInt8]
    private let prefixLength: Int
    public let description: String

    /// Parses `address` or `address/prefix`; nil when it is neither.
    public init?(_ text: String) {
        let parts = text.trimmingCharacters(in: .whitespaces).split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 1 || parts.count == 2, let address = IPAddress(String(parts[0])) else { return nil }
        let maximum = address.isIPv4 ? 32 : 128
        var length = maximum
        if parts.count == 2 {
            guard let parsed = Int(parts[1]), (0...maximum).contains(parsed) else { return nil }
            length = parsed
        }
        let bits = address.isIPv4 ? length + 96 : length
        network = Self.masked(address.bytes, bits: bits)
        prefixLength = bits
        description = "\(address)/\(length)"
    }

    public func contains(_ address: IPAddress) -> Bool {
        // Byte by byte, without building the masked address (this runs for every request).
        var remaining = prefixLength
        for index in 0..<16 where remaining > 0 {
            let mask: UInt8 = remaining >= 8 ? 0xFF : UInt8(truncatingIfNeeded: 0xFF << (8 - remaining))
            if address.bytes[index] & mask != network[index] { return false }
            remaining -= 8
        }
        return true
    }

    /// Loopback, private (RFC 1918, unique local) and shared (RFC 6598) addresses: where proxies usually are.
    public static let privateRanges = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "::1", "fc00::/7"]
        .compactMap { AddressRange($0) }

    private static func masked(_ bytes: [UInt8], bits: Int) -> [UInt8] {
        bytes.enumerated().map { index, byte in
            let remaining = bits - index * 8
            if remaining >= 8 { return byte }
            if remaining <= 0 { return 0 }
            return byte & UInt8(truncatingIfNeeded: 0xFF << (8 - remaining))
        }
    }
}

/// An IPv4 or IPv6 address, as 16 bytes (IPv4 mapped into IPv6).
public struct IPAddress: Sendable, Hashable, CustomStringConvertible {
    public let bytes: [UInt8]

    /// Parses a textual address (also `[v6]`, `[v6]:port`, `a.b.c.d:port` and a `%zone`); nil when it is not one.
    ///
    /// The ingest parses its peer's address for every request. ASCII text (every peer address, and every
    /// address a proxy writes) is trimmed and searched byte by byte and handed to `inet_pton` from a stack
    /// buffer: Foundation's `trimmingCharacters` and Character-wise searches here were 1.1% of the relay's
    /// CPU at saturation (`perf`, the e2e bench). Other text takes the Character-wise path, as before.
    public init?(_ text: String) {
        guard let bytes = Self.parse(text) else { return nil }
        self.bytes = bytes
    }

    private static func parse(_ text: String) -> [UInt8]? {
        guard text.utf8.allSatisfy({ $0 < 0x80 }) else { return parseCharacters(text) }
        var text = text
        return text.withUTF8 { utf8 -> [UInt8]? in
            // Space and tab are the only ASCII members of Foundation's `.whitespaces`.
            let space = UInt8(ascii: " "), tab = UInt8(ascii: "\t")
            var start = 0
            var end = utf8.count
            while start < end, utf8[start] == space || utf8[start] == tab { start += 1 }
            while end > start, utf8[end - 1] == space || utf8[end - 1] == tab { end -= 1 }
            func first(_ byte: UInt8, in range: Range<Int>) -> Int? { range.first { utf8[$0] == byte } }
            // `[v6]` and `[v6]:port`, `a.b.c.d:port` (some proxies record the port too).
            if start < end, utf8[start] == UInt8(ascii: "["), let close = first(UInt8(ascii: "]"), in: start..<end) {
                (start, end) = (start + 1, close)
            } else if first(UInt8(ascii: "."), in: start..<end) != nil, let colon = first(UInt8(ascii: ":"), in: start..<end),
                first(UInt8(ascii: ":"), in: (colon + 1)..<end) == nil
            {
                end = colon
            }
            if let zone = first(UInt8(ascii: "%"), in: start..<end) { end = zone }
            guard start < end, end - start <= 45 else { return nil }
            return presentationToBytes(UnsafeBufferPointer(rebasing: utf8[start..<end]))
        }
    }

    /// `inet_pton` of at most 45 bytes, IPv4 first, through a stack buffer.
    private static func presentationToBytes(_ text: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        guard text.count <= 45 else { return nil }
        return withUnsafeTemporaryAllocation(of: CChar.self, capacity: 46) { buffer -> [UInt8]? in
            for offset in text.indices { buffer[offset] = CChar(bitPattern: text[offset]) }
            buffer[text.count] = 0
            var v4 = in_addr()
            if inet_pton(AF_INET, buffer.baseAddress!, &v4) == 1 {
                let value = UInt32(bigEndian: v4.s_addr)
                return [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF] + [24, 16, 8, 0].map { UInt8(truncatingIfNeeded: value >> $0) }
            }
            var v6 = in6_addr()
            guard inet_pton(AF_INET6, buffer.baseAddress!, &v6) == 1 else { return nil }
            return withUnsafeBytes(of: &v6) { Array($0) }
        }
    }

    /// Text that is not all ASCII, as before the byte-wise path: Foundation's trimming, and the delimiters
    /// searched as Characters (a delimiter followed by a combining mark is part of another Character).
    /// Such text is an address only if what is not ASCII is trimmed or cut away with a port or a zone.
    /// (Internal: the tests hold the byte-wise path to it.)
    static func parseCharacters(_ text: String) -> [UInt8]? {
        var text = Substring(text.trimmingCharacters(in: .whitespaces))
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            text = text[text.index(after: text.startIndex)..<close]
        } else if text.utf8.contains(UInt8(ascii: ".")), let colon = text.firstIndex(of: ":"), text.lastIndex(of: ":") == colon {
            text = text[..<colon]
        }
        if let zone = text.firstIndex(of: "%") { text = text[..<zone] }
        guard !text.isEmpty, text.utf8.count <= 45 else { return nil }
        var address = String(text)
        return address.withUTF8 { presentationToBytes($0) }
    }

    public var isIPv4: Bool { bytes.prefix(10).allSatisfy { $0 == 0 } && bytes[10] == 0xFF && bytes[11] == 0xFF }

    public var description: String {
        if isIPv4 { return "\(bytes[12]).\(bytes[13]).\(bytes[14]).\(bytes[15])" }
        var address = in6_addr()
        withUnsafeMutableBytes(of: &address) { $0.copyBytes(from: bytes) }
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        guard inet_ntop(AF_INET6, &address, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The key a per-client limit counts by: an IPv4 address as it is, an IPv6 address by its /64 (one
    /// subscriber usually holds a whole /64, so its 2^64 addresses share one count).
    public var clientKey: String {
        if isIPv4 { return description }
        let prefix = IPAddress(unchecked: Array(bytes.prefix(8)) + Array(repeating: 0, count: 8))
        return "\(prefix)/64"
    }

    private init(unchecked bytes: [UInt8]) { self.bytes = bytes }
}

/// Who sent a request: the TCP peer, or, when the peer is one of the operator's `trustedProxies`, the
/// address those proxies recorded in `X-Forwarded-For`. The header is read from the right: each proxy
/// appends the address it received the request from, so the first entry not itself a trusted proxy is
/// the client. Entries further left were written by the client and are never believed. A peer that is
/// not a trusted proxy is the client, whatever header it sends.
public struct ClientAddressResolver: Sendable {
    public let trustedProxies: [AddressRange]

    public init(trustedProxies: [AddressRange]) {
        self.trustedProxies = trustedProxies
    }

    /// - Parameters:
    ///   - peer: the TCP peer's address (nil when unknown, e.g. a Unix socket).
    ///   - forwardedFor: every `X-Forwarded-For` field value of the request, in order.
    public func client(peer: String?, forwardedFor: [String]) -> IPAddress? {
        guard var client = peer.flatMap(IPAddress.init) else { return nil }
        guard isTrusted(client) else { return client }
        // Each entry is trimmed by `IPAddress.init`.
        let hops = forwardedFor.flatMap { $0.split(separator: ",") }.map(String.init)
        for hop in hops.reversed() {
            // An entry that is not an address ends the walk at the last proxy that can be trusted.
            guard let address = IPAddress(hop) else { return client }
            client = address
            if !isTrusted(address) { return address }
        }
        return client
    }

    private func isTrusted(_ address: IPAddress) -> Bool {
        trustedProxies.contains { $0.contains(address) }
    }
}
