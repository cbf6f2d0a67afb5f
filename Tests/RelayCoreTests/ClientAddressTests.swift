@testable import RelayCore
import RelayTestSupport
import Testing

/// Address ranges, client keys, and who a request came from behind the operator's proxies.
@Suite struct ClientAddressTests {
    func range(_ text: String) -> AddressRange { AddressRange(text)! }
    func address(_ text: String) -> IPAddress { IPAddress(text)! }

    @Test func rangesContainTheirAddressesOnly() {
        #expect(range("17.0.0.0/8").contains(address("17.255.1.2")))
        #expect(!range("17.0.0.0/8").contains(address("18.0.0.1")))
        #expect(range("17.0.0.0/8").contains(address("::ffff:17.1.2.3")), "an IPv4-mapped peer is the IPv4 address")
        #expect(range("10.1.2.3").contains(address("10.1.2.3")) && !range("10.1.2.3").contains(address("10.1.2.4")))
        #expect(range("2001:db8::/32").contains(address("2001:db8:ffff::1")))
        #expect(!range("2001:db8::/32").contains(address("2001:db9::1")))
        #expect(range("0.0.0.0/0").contains(address("203.0.113.1")))
        #expect(!range("0.0.0.0/0").contains(address("2001:db8::1")), "an IPv4 range holds no IPv6 address")
        #expect(range("192.168.0.0/23").contains(address("192.168.1.255")) && !range("192.168.0.0/23").contains(address("192.168.2.0")))
        for bad in ["", "17.0.0.0/33", "17.0.0.0/-1", "2001:db8::/129", "17.0.0", "example.com", "17.0.0.0/8/8", "1.2.3.4/x"] {
            #expect(AddressRange(bad) == nil, "\(bad)")
        }
    }

    @Test func addressesParseInTheFormsProxiesWrite() {
        #expect(IPAddress("[2001:db8::1]")?.description == "2001:db8::1")
        #expect(IPAddress("[2001:db8::1]:443")?.description == "2001:db8::1")
        #expect(IPAddress("198.51.100.7:5678")?.description == "198.51.100.7")
        #expect(IPAddress("fe80::1%eth0")?.description == "fe80::1")
        #expect(IPAddress(" 203.0.113.9 ")?.description == "203.0.113.9")
        #expect(IPAddress("unknown") == nil)
        #expect(IPAddress("1.2.3.4.5") == nil)
        // The per-client key: IPv4 as it is, IPv6 by its /64.
        #expect(address("198.51.100.7").clientKey == "198.51.100.7")
        #expect(address("2001:db8:1:2:aaaa::1").clientKey == "2001:db8:1:2::/64")
        #expect(address("2001:db8:1:2::ffff").clientKey == address("2001:0db8:0001:0002:0:0:0:1").clientKey)
        #expect(address("2001:db8:1:3::1").clientKey != address("2001:db8:1:2::1").clientKey)
    }

    @Test func whitespaceIsTrimmedAsFoundationTrimsIt() {
        #expect(IPAddress("\t198.51.100.7\t ")?.description == "198.51.100.7")
        #expect(IPAddress("\u{00A0}203.0.113.9\u{3000}")?.description == "203.0.113.9", "non-ASCII spaces are whitespace too")
        #expect(IPAddress("fe80::1%eth\u{E9}")?.description == "fe80::1", "a zone is cut whatever its characters")
        #expect(IPAddress("2001:db8::1\u{E9}") == nil)
        #expect(IPAddress("\n198.51.100.7") == nil, "a newline is not in .whitespaces")
        #expect(IPAddress(String(repeating: "0", count: 40) + "::1") == nil, "longer than any address")
        #expect(IPAddress("198.51.100.7:\u{301}8") == nil, "a colon with a combining mark is not a port's")
        #expect(IPAddress("1.2.3.4:80:\u{301}x")?.description == "1.2.3.4", "nor is it a second colon")
    }

    /// The byte-wise path against the Character-wise one it replaced (`parseCharacters`, which non-ASCII text
    /// still takes), on generated text made of the characters that matter (digits, hex, the delimiters,
    /// whitespace of both kinds, a non-ASCII letter, a combining mark, which makes a delimiter before it part
    /// of another Character).
    @Test func parsesExactlyAsTheCharacterWiseParserDid() {
        let pieces = ["1", "9", "25", "255", "256", "a", "f", "g", ".", ":", "::", "[", "]", "%", " ", "\t", "\u{00A0}", "\u{E9}", "\u{301}", "\0", "\r\n", "ffff", "2001", "0"]
        var generator = SeededGenerator(seed: 36)
        var samples = ["1.2.3.4", "[::1]:80", "::ffff:1.2.3.4", "1.2.3.4:80:90", "[::1", "[1.2.3.4]", "]1.2.3.4", "1.2.3.4%x", "[fe80::1%x]:9",
                       "1.2.3.4:80:\u{301}x", "[::1]\u{301}", "fe80::1%\u{301}", "\u{00A0}[::1]:8\u{E9}"]
        for _ in 0..<20_000 {
            let count = Int.random(in: 1...12, using: &generator)
            samples.append((0..<count).map { _ in pieces.randomElement(using: &generator)! }.joined())
        }
        // Addresses in the forms proxies write, with one or two pieces put in anywhere: many still parse.
        let addresses = ["198.51.100.7", "2001:db8::1", "[::1]:80", "fe80::1%eth0", " 10.0.0.1 ", "203.0.113.9:443", "::ffff:1.2.3.4"]
        for _ in 0..<20_000 {
            var characters = Array(addresses.randomElement(using: &generator)!)
            for _ in 0..<Int.random(in: 1...2, using: &generator) {
                characters.insert(contentsOf: pieces.randomElement(using: &generator)!, at: Int.random(in: 0...characters.count, using: &generator))
            }
            samples.append(String(characters))
        }
        var parsed = 0
        for sample in samples {
            let bytes = IPAddress(sample)?.bytes
            if bytes != nil { parsed += 1 }
            #expect(bytes == IPAddress.parseCharacters(sample), "\(sample.unicodeScalars.map { "U+\(String($0.value, radix: 16))" })")
        }
        #expect(parsed > 2_000, "the comparison covers addresses, not only refusals (\(parsed) parsed)")
    }

    @Test func forwardedForIsReadFromTheRightThroughTrustedProxiesOnly() {
        let resolver = ClientAddressResolver(trustedProxies: [range("10.0.0.0/8"), range("127.0.0.1")])
        func client(_ peer: String?, _ header: [String]) -> String? { resolver.client(peer: peer, forwardedFor: header)?.description }
        // An untrusted peer is the client, whatever it claims.
        #expect(client("203.0.113.5", ["198.51.100.1"]) == "203.0.113.5")
        // A trusted peer: the entry it added.
        #expect(client("10.0.0.2", ["198.51.100.1"]) == "198.51.100.1")
        // Through two proxies: skip the trusted hop.
        #expect(client("10.0.0.2", ["198.51.100.1, 10.0.0.9"]) == "198.51.100.1")
        // A client that writes its own entry in front: the first untrusted one from the right counts.
        #expect(client("10.0.0.2", ["192.0.2.66, 198.51.100.1"]) == "198.51.100.1")
        // Several header fields are one list, in order.
        #expect(client("127.0.0.1", ["192.0.2.66", "198.51.100.1"]) == "198.51.100.1")
        // No header, or every hop trusted: the last trusted address.
        #expect(client("10.0.0.2", []) == "10.0.0.2")
        #expect(client("10.0.0.2", ["10.0.0.7, 10.0.0.8"]) == "10.0.0.7")
        // Garbage ends the walk at the last proxy that can be trusted.
        #expect(client("10.0.0.2", ["198.51.100.1, not-an-address"]) == "10.0.0.2")
        #expect(client(nil, ["198.51.100.1"]) == nil)
        #expect(ClientAddressResolver(trustedProxies: []).client(peer: "127.0.0.1", forwardedFor: ["1.1.1.1"])?.description == "127.0.0.1")
    }
}

