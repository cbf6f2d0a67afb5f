/// A JSON value (RFC 8259), parsed exactly: integers that fit stay `Int64` (Apple's millisecond dates
/// and milliunit prices, Stripe's amounts), other numbers are `Double`, strings are validated UTF-8.
///
/// One model for every payload the relay reads or writes, so a notification decoded by verification
/// is printed by `inspect` and read by normalization without converting between representations.
public enum JSON: Sendable, Hashable {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    /// The member `key` of an object; nil for a missing member or a value that is not an object.
    public subscript(key: String) -> JSON? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    /// An integer, or a number with no fractional part that fits (`1.0e3` is 1000).
    public var int64Value: Int64? {
        switch self {
        case .integer(let value): value
        case .number(let value): Int64(exactly: value)
        default: nil
        }
    }

    public var doubleValue: Double? {
        switch self {
        case .integer(let value): Double(value)
        case .number(let value): value
        default: nil
        }
    }

    public var objectValue: [String: JSON]? {
        if case .object(let members) = self { return members }
        return nil
    }

    public var arrayValue: [JSON]? {
        if case .array(let elements) = self { return elements }
        return nil
    }

    public var isNull: Bool { self == .null }
}

// MARK: - Literals

extension JSON: ExpressibleByStringLiteral, ExpressibleByStringInterpolation, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral, ExpressibleByFloatLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(stringInterpolation: DefaultStringInterpolation) { self = .string(String(stringInterpolation: stringInterpolation)) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(floatLiteral value: Double) { self = .number(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    /// A repeated key keeps its last value. Inserted one by one into a dictionary sized for them all:
    /// `Dictionary(_:uniquingKeysWith:)` goes through its generic merge, which the hot path's events and
    /// records (built from literals) paid for.
    public init(dictionaryLiteral elements: (String, JSON)...) {
        var members = [String: JSON](minimumCapacity: elements.count)
        for (key, value) in elements { members[key] = value }
        self = .object(members)
    }
    public init(nilLiteral: ()) { self = .null }
}
