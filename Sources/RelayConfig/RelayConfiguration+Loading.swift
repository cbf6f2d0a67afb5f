import RelayCore
import Foundation
import Yams

extension RelayConfiguration {
    /// Loads and validates a configuration file.
    public static func load(path: String, environment: [String: String]? = nil) throws(ConfigurationError) -> RelayConfiguration {
        let url = URL(fileURLWithPath: path)
        let text: String
        do {
            text = try String(contentsOf: url, encoding: .utf8)
        } catch {
            throw ConfigurationError(key: "", message: "cannot read \(path): \(error.localizedDescription)")
        }
        let base = url.standardizedFileURL.deletingLastPathComponent().path
        do {
            return try parse(yaml: text, baseDirectory: base, environment: environment ?? ProcessInfo.processInfo.environment)
        } catch {
            // Which file, for an operator with several.
            throw ConfigurationError(key: error.key, message: "\(error.message) (in \(path))")
        }
    }

    /// What a YAML error says, without the file's text (it may hold secrets): where, and what.
    static func describe(yamlError error: any Error) -> String {
        guard let error = error as? YamlError else { return "not valid YAML" }
        switch error {
        case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _), .composer(_, let problem, let mark, _):
            return "not valid YAML at line \(mark.line), column \(mark.column): \(problem)"
        case .reader(let problem, let offset, _, _):
            return "not valid YAML: \(problem)\(offset.map { " at byte \($0)" } ?? "")"
        case .duplicatedKeysInMapping(let duplicates, let context):
            return "a key appears more than once in one mapping (near line \(context.mark.line)): \(duplicates.sorted().joined(separator: ", "))"
        default:
            return "not valid YAML"
        }
    }

    /// Parses configuration text; relative paths resolve against `baseDirectory`.
    public static func parse(yaml: String, baseDirectory: String, environment: [String: String]) throws(ConfigurationError) -> RelayConfiguration {
        let root: Yams.Node
        do {
            guard let parsed = try Yams.compose(yaml: yaml) else { throw ConfigurationError(key: "", message: "the file is empty") }
            root = parsed
        } catch let error as ConfigurationError {
            throw error
        } catch {
            // Never the error's own text: Yams quotes the file around the problem, secrets included.
            throw ConfigurationError(key: "", message: describe(yamlError: error))
        }
        let context = ConfigContext(environment: environment, baseDirectory: baseDirectory)
        let node = ConfigNode(node: root, path: "", context: context)
        let configuration: RelayConfiguration
        do {
            configuration = try ConfigParser.configuration(node)
        } catch {
            // An unset variable explains what its placeholder text then failed; report the variables.
            if let missing = missingError(context.missing, yaml: yaml, environment: environment) { throw missing }
            throw error
        }
        if let missing = missingError(context.missing, yaml: yaml, environment: environment) { throw missing }
        return configuration
    }

    /// Every unset `${NAME}` at once, in file order, with its line and, where the walk reached it, its key
    /// (an earlier error can stop the walk; the text still names them all). The error's key is the first's.
    private static func missingError(_ walked: MissingVariables, yaml: String, environment: [String: String]) -> ConfigurationError? {
        var entries = missingEnvironmentVariables(in: yaml, environment: environment).map { found in
            (name: found.name, line: found.line, key: walked.entries.first { $0.name == found.name && $0.line == found.line }?.key)
        }
        // A value the text scan could not see (a block scalar's later line) but the walk did.
        for entry in walked.entries where !entries.contains(where: { $0.name == entry.name && $0.key == entry.key }) {
            entries.append((entry.name, entry.line ?? 0, entry.key))
        }
        guard let first = entries.first else { return nil }
        let list = entries.map { entry in "\(entry.name) (\(entry.key.map { "\($0), " } ?? "")line \(entry.line))" }
        return ConfigurationError(
            key: first.key ?? "", message: "environment variable\(entries.count == 1 ? "" : "s") not set: \(list.joined(separator: "; "))")
    }

    /// Every `${NAME}` occurrence the text uses that `environment` lacks, in file order with its line.
    /// Comments (from ` #` or a line's leading `#`) are skipped.
    static func missingEnvironmentVariables(in yaml: String, environment: [String: String]) -> [(name: String, line: Int)] {
        var missing: [(name: String, line: Int)] = []
        for (index, line) in yaml.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var content = Substring(line)
            if content.drop(while: { $0 == " " }).hasPrefix("#") { continue }
            if let comment = content.range(of: " #") { content = content[..<comment.lowerBound] }
            var rest = content
            while let start = rest.range(of: "${") {
                guard let end = rest[start.upperBound...].firstIndex(of: "}") else { break }
                let name = String(rest[start.upperBound..<end])
                if !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }), environment[name] == nil,
                    !missing.contains(where: { $0.name == name && $0.line == index + 1 })
                {
                    missing.append((name, index + 1))
                }
                rest = rest[rest.index(after: end)...]
            }
        }
        return missing
    }
}
