/// A configuration problem found at startup. Names the key; never echoes a value (values may be secrets).
public struct ConfigurationError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The key path, e.g. `apps[0].stripe.tolerance`; empty for the file itself.
    public var key: String
    public var message: String

    public init(key: String, message: String) {
        self.key = key
        self.message = message
    }

    public var description: String {
        key.isEmpty ? "configuration: \(message)" : "configuration key \(key): \(message)"
    }
}
