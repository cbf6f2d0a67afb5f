import Foundation

/// The one way wire models become bytes and back: Foundation's JSON coders, with members sorted by
/// name (equal values give equal bytes, which the dedup and signature paths rely on) and slashes left
/// unescaped (URLs in payloads read as sent). Integers stay exact: models hold `Int64`, never `Double`.
public enum WireCoding {
    public static func encode(_ value: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // The models hold only strings, exact integers, booleans, finite numbers and `JSON`: none
        // can fail to encode, so a failure is a programming error, not an input error.
        do { return Array(try encoder.encode(value)) } catch { preconditionFailure("a wire model failed to encode: \(error)") }
    }

    /// Decodes `bytes`; a model's own validation error passes through unchanged, Foundation's errors
    /// become a `WireDecodingError` naming the member.
    public static func decode<Model: Decodable>(_ type: Model.Type, from bytes: some Collection<UInt8>) throws -> Model {
        do {
            return try JSONDecoder().decode(Model.self, from: Data(bytes))
        } catch let error as DecodingError {
            throw WireDecodingError(error)
        }
    }
}

/// Why bytes are not the expected wire model: the member's path (`data.price`, `$` for the whole
/// value) and what was wrong there.
public struct WireDecodingError: Error, Sendable, Equatable, CustomStringConvertible {
    public var field: String
    public var message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }

    init(_ error: DecodingError) {
        func path(_ codingPath: [any CodingKey]) -> String {
            codingPath.isEmpty ? "$" : codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .typeMismatch(let type, let context):
            self.init(field: path(context.codingPath), message: "expected \(Self.name(of: type))")
        case .valueNotFound(let type, let context):
            self.init(field: path(context.codingPath), message: "expected \(Self.name(of: type)), found null")
        case .keyNotFound(let key, let context):
            self.init(field: path(context.codingPath + [key]), message: "missing")
        case .dataCorrupted(let context):
            self.init(field: path(context.codingPath), message: context.codingPath.isEmpty ? "not valid JSON" : "not a valid value")
        @unknown default:
            self.init(field: "$", message: "not valid")
        }
    }

    private static func name(of type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Bool.Type: "a boolean"
        case is Int64.Type, is Int.Type: "an integer"
        case is Double.Type: "a number"
        default: "a value of another type"
        }
    }

    public var description: String { "\(field): \(message)" }
}

// MARK: - JSON as a wire model

/// `JSON` inside a typed model: parts that pass through untouched (a notification's context, store
/// payloads kept as sent). Integers decode as `.integer` when exact, so ids and milliseconds survive.
extension JSON: Codable {
    public init(from decoder: any Decoder) throws {
        if var array = try? decoder.unkeyedContainer() {
            var elements: [JSON] = []
            while !array.isAtEnd { elements.append(try array.decode(JSON.self)) }
            self = .array(elements)
            return
        }
        if let object = try? decoder.container(keyedBy: AnyKey.self) {
            var members: [String: JSON] = [:]
            for key in object.allKeys { members[key.stringValue] = try object.decode(JSON.self, forKey: key) }
            self = .object(members)
            return
        }
        let single = try decoder.singleValueContainer()
        if single.decodeNil() {
            self = .null
        } else if let flag = try? single.decode(Bool.self) {
            self = .bool(flag)
        } else if let integer = try? single.decode(Int64.self) {
            self = .integer(integer)
        } else if let number = try? single.decode(Double.self) {
            self = .number(number)
        } else {
            self = .string(try single.decode(String.self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .null:
            var single = encoder.singleValueContainer()
            try single.encodeNil()
        case .bool(let value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case .integer(let value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case .number(let value):
            var single = encoder.singleValueContainer()
            if value.isFinite { try single.encode(value) } else { try single.encodeNil() }
        case .string(let value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case .array(let elements):
            var array = encoder.unkeyedContainer()
            for element in elements { try array.encode(element) }
        case .object(let members):
            var object = encoder.container(keyedBy: AnyKey.self)
            for (key, value) in members { try object.encode(value, forKey: AnyKey(key)) }
        }
    }

    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}
