// The JSON value type's writer: compact, members sorted by name.

extension JSON {
    /// Compact UTF-8 JSON with object members sorted by name, so equal values serialize identically.
    public func serialized() -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(256)
        write(to: &output)
        return output
    }

    /// `serialized()` as a String.
    public var text: String { String(decoding: serialized(), as: UTF8.self) }

    func write(to output: inout [UInt8]) {
        switch self {
        case .null: output.append(contentsOf: "null".utf8)
        case .bool(let value): output.append(contentsOf: (value ? "true" : "false").utf8)
        case .integer(let value): output.append(contentsOf: String(value).utf8)
        case .number(let value):
            // Swift prints the shortest representation that round-trips; integral doubles keep ".0".
            // Parsing never yields infinities or NaN; one built in code has no JSON form.
            output.append(contentsOf: (value.isFinite ? value.description : "null").utf8)
        case .string(let value): JSON.writeString(value, to: &output)
        case .array(let elements):
            JSON.writeArray(elements, to: &output) { element, output in element.write(to: &output) }
        case .object(let members):
            output.append(UInt8(ascii: "{"))
            // Sorted as pairs: each value is at hand, not looked up (hashed) again by its name.
            for (offset, member) in members.sorted(by: { $0.key < $1.key }).enumerated() {
                if offset > 0 { output.append(UInt8(ascii: ",")) }
                JSON.writeString(member.key, to: &output)
                output.append(UInt8(ascii: ":"))
                member.value.write(to: &output)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    /// Appends a JSON array whose elements `write` appends, one call each (elements kept as bytes go out
    /// as they are).
    public static func writeArray<Elements: Sequence>(
        _ elements: Elements, to output: inout [UInt8], _ write: (Elements.Element, inout [UInt8]) -> Void
    ) {
        output.append(UInt8(ascii: "["))
        var first = true
        for element in elements {
            if !first { output.append(UInt8(ascii: ",")) }
            first = false
            write(element, &output)
        }
        output.append(UInt8(ascii: "]"))
    }

    /// The members of `members` and one more, `spliced`, whose value `write` appends, as one object in
    /// the order `serialized()` gives (a value kept as bytes goes out without being parsed). The spliced
    /// value replaces a member of `members` of the same name.
    public static func serializedObject(_ members: [String: JSON], splicing spliced: String, _ write: (inout [UInt8]) -> Void) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(1024)
        output.append(UInt8(ascii: "{"))
        var names = members.keys.filter { $0 != spliced }
        names.append(spliced)
        for (offset, name) in names.sorted().enumerated() {
            if offset > 0 { output.append(UInt8(ascii: ",")) }
            writeString(name, to: &output)
            output.append(UInt8(ascii: ":"))
            if name == spliced { write(&output) } else { members[name].unsafelyUnwrapped.write(to: &output) }
        }
        output.append(UInt8(ascii: "}"))
        return output
    }

    static func writeString(_ value: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        // Runs that need no escape are copied whole.
        let copied: Void? = value.utf8.withContiguousStorageIfAvailable { text in
            var run = 0
            var passed: UInt8 = 0
            while true {
                let position = JSONStringBytes.firstSpecial(in: text, from: run, passedOver: &passed)
                output.append(contentsOf: UnsafeBufferPointer(rebasing: text[run..<position]))
                guard position < text.count else { break }
                writeEscaped(text[position], to: &output)
                run = position + 1
            }
        }
        if copied == nil {
            for byte in value.utf8 {
                if JSONStringBytes.isSpecial(byte) { writeEscaped(byte, to: &output) } else { output.append(byte) }
            }
        }
        output.append(UInt8(ascii: "\""))
    }

    private static func writeEscaped(_ byte: UInt8, to output: inout [UInt8]) {
        switch byte {
        case UInt8(ascii: "\""): output.append(contentsOf: #"\""#.utf8)
        case UInt8(ascii: "\\"): output.append(contentsOf: #"\\"#.utf8)
        case 0x0A: output.append(contentsOf: #"\n"#.utf8)
        case 0x0D: output.append(contentsOf: #"\r"#.utf8)
        case 0x09: output.append(contentsOf: #"\t"#.utf8)
        default:
            let hex = Array("0123456789abcdef".utf8)
            output.append(contentsOf: #"\u00"#.utf8)
            output.append(hex[Int(byte >> 4)])
            output.append(hex[Int(byte & 0x0F)])
        }
    }
}

/// Writes JSON objects whose members the caller gives in the order `serialized()` puts them (by name), without
/// building a `JSON` tree: no dictionary, no sort. For a hot path's fixed shape (an event's payload), with a test
/// that holds its bytes to `serialized()`'s of the same value. Nothing checks the order or the alternation of
/// names and values here: the test does, so it stays inside this module.
struct JSONMembersWriter {
    private(set) var output: [UInt8]
    private var afterValue = false

    init(capacity: Int) {
        output = []
        output.reserveCapacity(capacity)
    }

    /// Starts an object (a member's value, or the top level).
    mutating func open() {
        if afterValue { output.append(UInt8(ascii: ",")) }
        output.append(UInt8(ascii: "{"))
        afterValue = false
    }

    /// Ends the object; it is the value of its member.
    mutating func close() {
        output.append(UInt8(ascii: "}"))
        afterValue = true
    }

    /// The next member's name: plain ASCII that needs no escape, after the previous member's in name order.
    mutating func key(_ name: StaticString) {
        if afterValue { output.append(UInt8(ascii: ",")) }
        output.append(UInt8(ascii: "\""))
        output.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        output.append(UInt8(ascii: "\""))
        output.append(UInt8(ascii: ":"))
        afterValue = false
    }

    /// The member's value, as `serialized()` writes it.
    mutating func value(_ value: JSON) {
        value.write(to: &output)
        afterValue = true
    }

    mutating func string(_ value: String) {
        JSON.writeString(value, to: &output)
        afterValue = true
    }

    /// `key(name)` and `value(value)`.
    mutating func member(_ name: StaticString, _ value: JSON) {
        key(name)
        self.value(value)
    }

    /// `key(name)` and `string(value)`.
    mutating func member(_ name: StaticString, string value: String) {
        key(name)
        string(value)
    }

    /// The member with its value, or `null` when there is none (as the trees write an absent optional).
    mutating func member(_ name: StaticString, optional value: String?) {
        if let value { member(name, string: value) } else { member(name, .null) }
    }

    mutating func member(_ name: StaticString, optional value: Int64?) {
        member(name, value.map(JSON.integer) ?? .null)
    }

    mutating func member(_ name: StaticString, optional value: Double?) {
        member(name, value.map(JSON.number) ?? .null)
    }
}

