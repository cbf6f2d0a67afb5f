// The JSON value type's parser: `JSON.parse`, and the deferred parse a stored subscription state uses.

/// Why bytes are not one JSON value; `offset` is the byte where parsing stopped.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var message: String

    public var description: String { "not valid JSON at byte \(offset): \(message)" }
}

extension JSON {
    /// Nesting deeper than this is refused, so hostile input cannot exhaust a thread's stack.
    public static let maximumDepth = 100

    /// Parses exactly one JSON value (surrounded by optional whitespace).
    ///
    /// - Parameter clampingNumbers: a number beyond a Double's range (`1e999999`, valid JSON) is read as
    ///   the largest finite Double of its sign instead of refused. For readers that only look at other
    ///   members (the ingest's key), so a store's valid body is never answered 400.
    public static func parse(_ bytes: [UInt8], clampingNumbers: Bool = false) throws(JSONParseError) -> JSON {
        try bytes.withUnsafeBufferPointer { (buffer) throws(JSONParseError) -> JSON in
            var parser = JSONParser(bytes: buffer)
            parser.clampsNumbers = clampingNumbers
            let value = try parser.parseDocument()
            return value
        }
    }

    /// Parses UTF-8 text as one JSON value.
    public static func parse(_ text: String) throws(JSONParseError) -> JSON {
        try parse(Array(text.utf8))
    }

    /// The member names `parse(_:keepingMembersNamed:)` builds, as UTF-8 once: a reader that parses every
    /// record keeps its names in a `static let`.
    public struct MemberNames: Sendable, ExpressibleByArrayLiteral {
        let utf8: [[UInt8]]

        public init(_ names: [String]) {
            utf8 = names.map { Array($0.utf8) }
        }

        public init(arrayLiteral names: String...) {
            self.init(names)
        }
    }

    /// Parses one JSON value as `parse` does (refusing what it refuses), except that in every object, at any
    /// depth, a member whose name is not in `names` is checked but not built: the tree leaves it out. For a
    /// reader of a few members of a large document (the events recorder names 19 of an event's 50 or so).
    public static func parse(_ bytes: [UInt8], keepingMembersNamed names: MemberNames) throws(JSONParseError) -> JSON {
        try bytes.withUnsafeBufferPointer { (buffer) throws(JSONParseError) -> JSON in
            var parser = JSONParser(bytes: buffer)
            parser.kept = names.utf8
            return try parser.parseDocument()
        }
    }

    /// Parses one JSON value as `parse` does, except that in each object element of the array under the
    /// top-level member `list`, the value of the member `member` is checked but not built: the tree holds
    /// null there, and its bytes are returned by the element's index. A subscription state's remembered
    /// contexts are most of its bytes and are read only when a notification comes again.
    static func parse(
        _ bytes: [UInt8], deferring member: String, under list: String
    ) throws(JSONParseError) -> (value: JSON, deferred: [Int: [UInt8]]) {
        try bytes.withUnsafeBufferPointer { (buffer) throws(JSONParseError) -> (value: JSON, deferred: [Int: [UInt8]]) in
            var parser = JSONParser(bytes: buffer)
            parser.deferral = (list, member)
            let value = try parser.parseDocument()
            return (value, parser.deferred)
        }
    }
}

private struct JSONParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0
    var depth = 0
    var clampsNumbers = false
    /// `JSON.parse(_:deferring:under:)`: the top-level array member, and the member of its elements kept as bytes.
    var deferral: (list: String, member: String)?
    /// The deferred members' bytes, by element index.
    var deferred: [Int: [UInt8]] = [:]
    /// `JSON.parse(_:keepingMembersNamed:)`: the names of the members built, as UTF-8.
    var kept: [[UInt8]]?

    init(bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    mutating func parseDocument() throws(JSONParseError) -> JSON {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        guard index == bytes.count else { throw error("unexpected content after the value") }
        return value
    }

    private func error(_ message: String) -> JSONParseError {
        JSONParseError(offset: index, message: message)
    }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"): index += 1
            default: return
            }
        }
    }

    private mutating func parseValue() throws(JSONParseError) -> JSON {
        guard index < bytes.count else { throw error("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try parseNumber()
        default:
            throw error("unexpected character")
        }
    }

    private mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        guard bytes.count - index >= count else { throw error("unexpected end of input") }
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: count)
        for offset in 0..<count where bytes[index + offset] != expected[offset] {
            throw error("unexpected character")
        }
        index += count
    }

    private mutating func enter() throws(JSONParseError) {
        depth += 1
        guard depth <= JSON.maximumDepth else { throw error("nested deeper than \(JSON.maximumDepth) levels") }
    }

    /// Enters the object or array at `index`; true when it is empty (`close` read, and left again).
    private mutating func open(closedBy close: UInt8) throws(JSONParseError) -> Bool {
        try enter()
        index += 1
        skipWhitespace()
        guard index < bytes.count, bytes[index] == close else { return false }
        index += 1
        depth -= 1
        return true
    }

    /// After a member or element: false after a ',' (another follows), true when `close` ends the container.
    private mutating func ends(closedBy close: UInt8) throws(JSONParseError) -> Bool {
        skipWhitespace()
        guard index < bytes.count else { throw error("unexpected end of input") }
        if bytes[index] == UInt8(ascii: ",") {
            index += 1
            return false
        }
        guard bytes[index] == close else { throw error(close == UInt8(ascii: "}") ? "expected ',' or '}'" : "expected ',' or ']'") }
        index += 1
        depth -= 1
        return true
    }

    /// Moves to the member name that must come next.
    private mutating func toMemberName() throws(JSONParseError) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a member name") }
    }

    /// Reads the ':' after a member's name, and moves to its value.
    private mutating func toMemberValue() throws(JSONParseError) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':'") }
        index += 1
        skipWhitespace()
    }

    /// - Parameter element: this object is element `element` of the deferred list: its deferred member is kept as bytes.
    private mutating func parseObject(element: Int? = nil) throws(JSONParseError) -> JSON {
        if try open(closedBy: UInt8(ascii: "}")) { return .object([:]) }
        // Room for eight members from the start: most objects parsed are payloads of ten or more.
        var members = [String: JSON](minimumCapacity: 8)
        while true {
            try toMemberName()
            if let kept, try !isKept(kept) {
                try toMemberValue()
                try skipValue()
                if try ends(closedBy: UInt8(ascii: "}")) { return .object(members) }
                continue
            }
            let key = try parseString()
            try toMemberValue()
            if let deferral {
                if let element, key == deferral.member {
                    let start = index
                    try skipValue()
                    deferred[element] = Array(bytes[start..<index])
                    members[key] = .null
                } else if depth == 1, key == deferral.list, index < bytes.count, bytes[index] == UInt8(ascii: "[") {
                    // A repeated member replaces the earlier one, its kept bytes too.
                    deferred = [:]
                    members[key] = try parseArray(deferringElements: true)
                } else {
                    members[key] = try parseValue()
                }
            } else {
                members[key] = try parseValue()
            }
            if try ends(closedBy: UInt8(ascii: "}")) { return .object(members) }
        }
    }

    /// At a member name: false, past the name, when it is plain ASCII and not in `kept`; otherwise true, still
    /// at the name (escaped or other text is compared after `parseString` decoded it).
    private mutating func isKept(_ kept: [[UInt8]]) throws(JSONParseError) -> Bool {
        let start = index + 1
        var passed: UInt8 = 0
        let end = JSONStringBytes.firstSpecial(in: bytes, from: start, passedOver: &passed)
        guard end < bytes.count, bytes[end] == UInt8(ascii: "\""), passed & 0x80 == 0 else {
            let mark = index
            let name = Array(try parseString().utf8)
            if kept.contains(name) {
                index = mark
                return true
            }
            return false
        }
        let name = UnsafeBufferPointer(rebasing: bytes[start..<end])
        if kept.contains(where: { $0.count == name.count && $0.elementsEqual(name) }) { return true }
        index = end + 1
        return false
    }

    /// - Parameter deferringElements: the deferred list: its object elements keep their deferred member as bytes.
    private mutating func parseArray(deferringElements: Bool = false) throws(JSONParseError) -> JSON {
        var elements: [JSON] = []
        if try open(closedBy: UInt8(ascii: "]")) { return .array(elements) }
        while true {
            skipWhitespace()
            if deferringElements, index < bytes.count, bytes[index] == UInt8(ascii: "{") {
                elements.append(try parseObject(element: elements.count))
            } else {
                elements.append(try parseValue())
            }
            if try ends(closedBy: UInt8(ascii: "]")) { return .array(elements) }
        }
    }

    private mutating func parseString() throws(JSONParseError) -> String {
        index += 1  // the opening quote
        let start = index
        // Fast path: no escapes. The strings here are mostly long runs of base64 (12.7 KB JWS in an Apple
        // notification), passed over eight bytes at a time.
        var passed: UInt8 = 0
        index = JSONStringBytes.firstSpecial(in: bytes, from: index, passedOver: &passed)
        guard index < bytes.count else { throw error("unterminated string") }
        switch bytes[index] {
        case UInt8(ascii: "\""):
            let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
            // ASCII is valid UTF-8 as it is; only other text needs the (slower, generic) validation.
            let text: String
            if passed & 0x80 == 0 {
                text = String(decoding: slice, as: UTF8.self)
            } else {
                guard let validated = String(validating: slice, as: UTF8.self) else { throw error("string is not valid UTF-8") }
                text = validated
            }
            index += 1
            return text
        case UInt8(ascii: "\\"): break  // escapes: the slow path below
        default: throw error("control character in string")
        }
        var scratch = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                guard let text = String(validating: scratch, as: UTF8.self) else { throw error("string is not valid UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw error("unterminated string") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scratch.append(escape)
                case UInt8(ascii: "b"): scratch.append(0x08)
                case UInt8(ascii: "f"): scratch.append(0x0C)
                case UInt8(ascii: "n"): scratch.append(0x0A)
                case UInt8(ascii: "r"): scratch.append(0x0D)
                case UInt8(ascii: "t"): scratch.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try parseHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard bytes.count - index >= 6, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
                        else { throw error("unpaired surrogate in string") }
                        index += 2
                        let low = try parseHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw error("unpaired surrogate in string") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw error("unpaired surrogate in string")
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw error("invalid escape") }
                    scratch.append(contentsOf: String(Character(unicode)).utf8)
                default:
                    throw error("invalid escape")
                }
            default:
                guard byte >= 0x20 else { throw error("control character in string") }
                scratch.append(byte)
                index += 1
            }
        }
        throw error("unterminated string")
    }

    private mutating func parseHex4() throws(JSONParseError) -> UInt32 {
        guard bytes.count - index >= 4 else { throw error("invalid \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw error("invalid \\u escape")
            }
            value = value << 4 | UInt32(digit)
            index += 1
        }
        return value
    }

    /// Reads a number's grammar from `index`; true when it has no fraction and no exponent.
    private mutating func scanNumber() throws(JSONParseError) -> Bool {
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        var isInteger = true
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        return isInteger
    }

    private mutating func parseNumber() throws(JSONParseError) -> JSON {
        let start = index
        let isInteger = try scanNumber()
        if isInteger {
            // Up to 18 digits cannot overflow: summed here, without a String (timestamps are most numbers).
            let negative = bytes[start] == UInt8(ascii: "-")
            let digits = negative ? start + 1 ..< index : start ..< index
            if digits.count <= 18 {
                var value: Int64 = 0
                for position in digits { value = value &* 10 &+ Int64(bytes[position] &- UInt8(ascii: "0")) }
                return .integer(negative ? -value : value)
            }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        if isInteger, let value = Int64(text) { return .integer(value) }
        guard let value = Double(text) else { throw error("invalid number") }
        guard value.isFinite else {
            guard clampsNumbers else { throw error("number out of range") }
            return .number(value < 0 ? -Double.greatestFiniteMagnitude : .greatestFiniteMagnitude)
        }
        return .number(value)
    }

    /// Checks one value as `parseValue` would, building nothing (a deferred member).
    private mutating func skipValue() throws(JSONParseError) {
        guard index < bytes.count else { throw error("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"):
            if try open(closedBy: UInt8(ascii: "}")) { return }
            repeat {
                try toMemberName()
                try skipString()
                try toMemberValue()
                try skipValue()
            } while try !ends(closedBy: UInt8(ascii: "}"))
        case UInt8(ascii: "["):
            if try open(closedBy: UInt8(ascii: "]")) { return }
            repeat {
                skipWhitespace()
                try skipValue()
            } while try !ends(closedBy: UInt8(ascii: "]"))
        case UInt8(ascii: "\""):
            try skipString()
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            let start = index
            // An integer of up to 18 digits is always readable; anything else (a fraction, an exponent, a
            // long integer that must fit a Double) is read as parsing would, to refuse what it refuses.
            if !(try scanNumber()) || index - start > 18 {
                index = start
                _ = try parseNumber()
            }
        default:
            _ = try parseValue()
        }
    }

    /// Checks one string as `parseString` would: plain ASCII is scanned; anything with an escape or other
    /// text goes through `parseString` itself.
    private mutating func skipString() throws(JSONParseError) {
        let start = index
        index += 1
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return
            }
            guard byte >= 0x20, byte < 0x80, byte != UInt8(ascii: "\\") else {
                index = start
                _ = try parseString()
                return
            }
            index += 1
        }
        throw error("unterminated string")
    }

    private func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
}

/// The bytes a JSON string cannot hold as they are: a quote, a backslash, a control byte (below 0x20). The
/// parser's fast path and the serializer's copied runs look for them, eight bytes at a time: the strings
/// are mostly long runs of base64, and a byte at a time this scan was the largest of the parser's costs
/// (`perf`, the e2e bench).
enum JSONStringBytes {
    private static let lowBits: UInt64 = 0x0101_0101_0101_0101
    private static let highBits: UInt64 = 0x8080_8080_8080_8080

    @inline(__always) static func isSpecial(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20
    }

    /// The offset of the first special byte at or after `start`, or `bytes.count`; `passedOver` gets every
    /// byte before it ORed in (its top bit says whether any was not ASCII).
    @inline(__always) static func firstSpecial(in bytes: UnsafeBufferPointer<UInt8>, from start: Int, passedOver: inout UInt8) -> Int {
        var index = start
        if let base = bytes.baseAddress {
            var seen: UInt64 = 0
            while bytes.count &- index >= 8 {
                let word = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                if hasSpecialByte(word) { break }
                seen |= word
                index &+= 8
            }
            if seen & highBits != 0 { passedOver |= 0x80 }
        }
        while index < bytes.count {
            let byte = bytes[index]
            if isSpecial(byte) { break }
            passedOver |= byte
            index += 1
        }
        return index
    }

    /// Whether any of the eight bytes in `word` is special. Each test is the exact "has a byte below n" word
    /// trick: `(x - n·0x01…) & ~x & 0x80…` is nonzero exactly when some byte of x is below n (a byte at or
    /// above 0x80 never sets its own bit); a quote or a backslash is a zero byte of `word` XOR it.
    @inline(__always) private static func hasSpecialByte(_ word: UInt64) -> Bool {
        let quote = word ^ (lowBits &* UInt64(UInt8(ascii: "\"")))
        let backslash = word ^ (lowBits &* UInt64(UInt8(ascii: "\\")))
        let found = ((quote &- lowBits) & ~quote) | ((backslash &- lowBits) & ~backslash) | ((word &- lowBits &* 0x20) & ~word)
        return found & highBits != 0
    }
}
