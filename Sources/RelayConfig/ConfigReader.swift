import Foundation
import Yams

/// Reads typed values out of the YAML tree, tracking the key path for error messages, substituting
/// `${NAME}` from the environment, resolving paths against the config file's folder, and rejecting
/// keys it does not know.
struct ConfigNode {
    let node: Yams.Node
    let path: String
    let context: ConfigContext

    func child(_ node: Yams.Node, _ component: String) -> ConfigNode {
        ConfigNode(node: node, path: path.isEmpty ? component : "\(path).\(component)", context: context)
    }

    func error(_ message: String) -> ConfigurationError { ConfigurationError(key: path, message: message) }

    /// A mapping whose keys must all be in `known`.
    func mapping(known: [String]) throws(ConfigurationError) -> ConfigMapping {
        guard case .mapping(let mapping) = node else { throw error("expected a mapping") }
        var entries: [String: Yams.Node] = [:]
        for (keyNode, value) in mapping {
            guard let key = keyNode.string else { throw error("keys must be strings") }
            guard known.contains(key) else {
                let childPath = path.isEmpty ? key : "\(path).\(key)"
                throw ConfigurationError(key: childPath, message: "unknown key (known here: \(known.joined(separator: ", ")))")
            }
            entries[key] = value
        }
        return ConfigMapping(entries: entries, node: self)
    }

    func sequence() throws(ConfigurationError) -> [ConfigNode] {
        guard case .sequence(let sequence) = node else { throw error("expected a list") }
        return sequence.enumerated().map { index, element in
            ConfigNode(node: element, path: "\(path)[\(index)]", context: context)
        }
    }

    func stringMap() throws(ConfigurationError) -> [String: String] {
        guard case .mapping(let mapping) = node else { throw error("expected a mapping") }
        var result: [String: String] = [:]
        for (keyNode, value) in mapping {
            guard let key = keyNode.string else { throw error("keys must be strings") }
            result[key] = try child(value, key).string()
        }
        return result
    }

    /// A scalar as text, with `${NAME}` replaced by the environment variable NAME.
    func string() throws(ConfigurationError) -> String {
        guard case .scalar(let scalar) = node else { throw error("expected a single value") }
        return try substitute(scalar.string)
    }

    private func substitute(_ text: String) throws(ConfigurationError) -> String {
        guard text.contains("${") else { return text }
        var result = ""
        var rest = Substring(text)
        while let start = rest.range(of: "${") {
            result += rest[..<start.lowerBound]
            guard let end = rest[start.upperBound...].firstIndex(of: "}") else { throw error("unterminated ${ in value") }
            let name = String(rest[start.upperBound..<end])
            guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else {
                throw error("invalid environment variable name in ${...}")
            }
            guard let value = context.environment[name] else {
                // Noted, and the walk goes on (with the text as it is), so one start names every unset variable.
                context.missing.add(name, key: path, line: node.mark.map(\.line))
                return text
            }
            result += value
            rest = rest[rest.index(after: end)...]
        }
        return result + rest
    }

    func nonEmptyString() throws(ConfigurationError) -> String {
        let value = try string()
        guard !value.isEmpty else { throw error("must not be empty") }
        return value
    }

    func int(in range: ClosedRange<Int> = Int.min...Int.max) throws(ConfigurationError) -> Int {
        guard let value = Int(try string()) else { throw error("expected a whole number") }
        guard range.contains(value) else { throw error("must be between \(range.lowerBound) and \(range.upperBound)") }
        return value
    }

    func double() throws(ConfigurationError) -> Double {
        guard let value = Double(try string()), value.isFinite else { throw error("expected a number") }
        return value
    }

    func bool() throws(ConfigurationError) -> Bool {
        switch try string().lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default: throw error("expected true or false")
        }
    }

    /// `250ms`, `15s`, `5m`, `2h`.
    func duration() throws(ConfigurationError) -> Duration {
        let text = try string().trimmingCharacters(in: .whitespaces)
        guard let parsed = DurationText.parse(text) else { throw error("expected a duration such as 250ms, 15s, 5m or 2h") }
        return parsed
    }

    /// A file path, relative to the config file's folder unless absolute. `mustExist` checks it now.
    func path(mustExist: Bool) throws(ConfigurationError) -> String {
        let text = try nonEmptyString()
        let resolved = text.hasPrefix("/") ? text : context.baseDirectory + "/" + text
        if mustExist && !FileManager.default.fileExists(atPath: resolved) {
            throw error("file not found: \(resolved)")
        }
        return resolved
    }

    /// `host:port`.
    func listenAddress() throws(ConfigurationError) -> ListenAddress {
        let text = try nonEmptyString()
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port)
        else { throw error("expected host:port") }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw error("expected host:port") }
        return ListenAddress(host: host, port: port)
    }

    func stringList() throws(ConfigurationError) -> [String] {
        var result: [String] = []
        for element in try sequence() { result.append(try element.string()) }
        return result
    }
}

struct ConfigContext {
    var environment: [String: String]
    var baseDirectory: String
    /// `${NAME}`s the environment lacks, in the order the walk met them (file order), reported together.
    let missing = MissingVariables()
}

/// The unset environment variables one parse met: the name, the key and the line.
final class MissingVariables: @unchecked Sendable {
    private(set) var entries: [(name: String, key: String, line: Int?)] = []

    func add(_ name: String, key: String, line: Int?) {
        guard !entries.contains(where: { $0.name == name && $0.key == key }) else { return }
        entries.append((name, key, line))
    }
}

/// A mapping already checked for unknown keys.
struct ConfigMapping {
    let entries: [String: Yams.Node]
    let node: ConfigNode

    func has(_ key: String) -> Bool { entries[key] != nil }

    func optional<T>(_ key: String, _ read: (ConfigNode) throws(ConfigurationError) -> T) throws(ConfigurationError) -> T? {
        guard let value = entries[key] else { return nil }
        if case .scalar(let scalar) = value, scalar.string == "~" || (scalar.string.isEmpty && scalar.style == .plain) {
            return nil
        }
        return try read(node.child(value, key))
    }

    func required<T>(_ key: String, _ read: (ConfigNode) throws(ConfigurationError) -> T) throws(ConfigurationError) -> T {
        guard let value = try optional(key, read) else {
            throw ConfigurationError(key: node.path.isEmpty ? key : "\(node.path).\(key)", message: "is required")
        }
        return value
    }
}

enum DurationText {
    static func parse(_ text: String) -> Duration? {
        let units: [(suffix: String, make: (Int64) -> Duration)] = [
            ("ms", { .milliseconds($0) }), ("s", { .seconds($0) }), ("m", { .seconds($0 * 60) }), ("h", { .seconds($0 * 3600) }),
        ]
        for unit in units where text.hasSuffix(unit.suffix) {
            let number = text.dropLast(unit.suffix.count)
            guard !number.isEmpty, number.allSatisfy(\.isASCII), let value = Int64(number), value >= 0 else { return nil }
            return unit.make(value)
        }
        return nil
    }
}
