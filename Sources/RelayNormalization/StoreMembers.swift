import RelayCore

/// A store payload's members, read as the mappings need them. Stores send ids as strings or numbers
/// and numbers as strings (Google's int64s), and a member of an unexpected type must not fail the
/// whole notification: it reads as absent, and the mapping decides whether that makes the notification
/// malformed (a transaction without its id) or leaves a field null.
struct StoreMembers<Key: CodingKey> {
    private let container: KeyedDecodingContainer<Key>

    init(_ decoder: any Decoder, keyedBy: Key.Type) throws {
        container = try decoder.container(keyedBy: Key.self)
    }

    /// A non-empty string, or an integer as text.
    func text(_ key: Key) -> String? {
        if let text = try? container.decodeIfPresent(String.self, forKey: key) { return text.isEmpty ? nil : text }
        return (try? container.decodeIfPresent(Int64.self, forKey: key)).flatMap { $0.map(String.init) }
    }

    /// An integer, or a string of one.
    func integer(_ key: Key) -> Int64? {
        if let number = try? container.decodeIfPresent(Int64.self, forKey: key) { return number }
        return (try? container.decodeIfPresent(String.self, forKey: key)).flatMap { $0.flatMap { Int64($0) } }
    }

    func bool(_ key: Key) -> Bool? {
        (try? container.decodeIfPresent(Bool.self, forKey: key)) ?? nil
    }

    /// A member in Unix seconds as Unix milliseconds; nil when absent, or too large to be a time (a
    /// store-supplied number must never trap the worker).
    func milliseconds(fromSeconds key: Key) -> Int64? {
        guard let seconds = integer(key) else { return nil }
        let (milliseconds, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        return overflow ? nil : milliseconds
    }

    /// A nested model; nil when absent, null, or not its shape.
    func nested<Model: Decodable>(_ type: Model.Type, _ key: Key) -> Model? {
        (try? container.decodeIfPresent(Model.self, forKey: key)) ?? nil
    }

    /// The member as sent, for parts that pass through untouched; nil when absent or null.
    func json(_ key: Key) -> JSON? {
        guard let value = (try? container.decodeIfPresent(JSON.self, forKey: key)) ?? nil, !value.isNull else { return nil }
        return value
    }
}
