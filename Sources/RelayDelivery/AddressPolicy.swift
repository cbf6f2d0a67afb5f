#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The SSRF guard's address rules: unless `delivery.allowPrivateNetworks` is true, an endpoint must not
/// reach loopback, private, link-local, carrier-grade NAT, cloud metadata or other non-public
/// addresses. The deliverer applies this to the address a connection actually reached (so a DNS
/// answer that changes between lookup and connect cannot slip past it).
public enum AddressPolicy {
    /// Why an address is refused, or nil when it is a public unicast address.
    public static func refusal(_ address: String) -> String? {
        if let v4 = ipv4(address) { return refusal(ipv4: v4) }
        if let v6 = ipv6(address) { return refusal(ipv6: v6) }
        return "not an IP address"
    }

    static func refusal(ipv4 a: [UInt8]) -> String? {
        let (b0, b1) = (a[0], a[1])
        switch true {
        case b0 == 0: return "\"this network\" (0.0.0.0/8)"
        case b0 == 10: return "private (10.0.0.0/8)"
        case b0 == 100 && (b1 & 0xC0) == 64: return "carrier-grade NAT (100.64.0.0/10)"
        case b0 == 127: return "loopback (127.0.0.0/8)"
        case b0 == 169 && b1 == 254: return "link-local or cloud metadata (169.254.0.0/16)"
        case b0 == 172 && (b1 & 0xF0) == 16: return "private (172.16.0.0/12)"
        case b0 == 192 && b1 == 0 && a[2] == 0: return "IETF protocol assignments (192.0.0.0/24)"
        case b0 == 192 && b1 == 168: return "private (192.168.0.0/16)"
        case b0 == 198 && (b1 & 0xFE) == 18: return "benchmarking (198.18.0.0/15)"
        case b0 >= 224: return "multicast or reserved (224.0.0.0/3)"
        default: return nil
        }
    }

    static func refusal(ipv6 a: [UInt8]) -> String? {
        let prefix = a.prefix(10).allSatisfy { $0 == 0 }
        if prefix, a[10] == 0xFF, a[11] == 0xFF { return refusal(ipv4: Array(a[12...])) }  // ::ffff:a.b.c.d
        if a.prefix(15).allSatisfy({ $0 == 0 }) { return a[15] == 1 ? "loopback (::1)" : "unspecified (::)" }
        if prefix, a[10] == 0, a[11] == 0 { return "IPv4-compatible (deprecated ::/96)" }
        // NAT64 (64:ff9b::/96) reaches the embedded IPv4 address.
        if a[0] == 0x00, a[1] == 0x64, a[2] == 0xFF, a[3] == 0x9B, a[4...11].allSatisfy({ $0 == 0 }) {
            return refusal(ipv4: Array(a[12...])).map { "NAT64 of \($0)" }
        }
        switch true {
        case (a[0] & 0xFE) == 0xFC: return "unique local (fc00::/7, includes cloud metadata fd00:ec2::254)"
        case a[0] == 0xFE && (a[1] & 0xC0) == 0x80: return "link-local (fe80::/10)"
        case a[0] == 0xFE && (a[1] & 0xC0) == 0xC0: return "site-local (fec0::/10)"
        case a[0] == 0xFF: return "multicast (ff00::/8)"
        case a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0D && a[3] == 0xB8: return "documentation (2001:db8::/32)"
        default: return nil
        }
    }

    static func ipv4(_ text: String) -> [UInt8]? {
        var address = in_addr()
        guard inet_pton(AF_INET, text, &address) == 1 else { return nil }
        return withUnsafeBytes(of: &address) { Array($0) }
    }

    static func ipv6(_ text: String) -> [UInt8]? {
        // A zone index (fe80::1%eth0) names a link-local address; inet_pton does not take it.
        let bare = text.split(separator: "%", maxSplits: 1).first.map(String.init) ?? text
        var address = in6_addr()
        guard inet_pton(AF_INET6, bare, &address) == 1 else { return nil }
        return withUnsafeBytes(of: &address) { Array($0) }
    }
}
