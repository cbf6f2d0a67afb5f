public import RelayCore

/// Why a store history command (`import`, `recover`, `reconcile`) or a backend read of the command line
/// (`events`, `revenue`) could not run or finish; `exitCode` is the sysexits code the CLI exits with.
public struct CommandFailure: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable {
        /// The configuration lacks what the command needs, or the App Store key is refused (exit 78).
        case configuration
        /// An argument is wrong (exit 64).
        case badArguments
        /// The log, the backend or Apple could not be reached (exit 69); running it again continues.
        case unavailable
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }

    public var exitCode: Int32 {
        switch kind {
        case .configuration: 78
        case .badArguments: 64
        case .unavailable: 69
        }
    }
}

extension CommandFailure {
    /// A failed backend read, said for the command line: what to do about it and the exit code.
    public init(_ error: BackendError, backendURL url: String) {
        switch error.kind {
        case .unauthorized: self.init(.configuration, "the backend at \(url) refused backend.apiKey")
        case .badRequest: self.init(.badArguments, "the backend at \(url) refused the request: \(error.message)")
        case .notFound, .invalidResponse: self.init(.unavailable, "the backend at \(url): \(error.message)")
        case .unavailable:
            // Unreachable, or a 5xx or 429 that outlasted the retries: both say "not now".
            self.init(
                .unavailable,
                "the backend at \(url) did not answer in time or is unavailable (\(error.message)); start it, or pass its address with --backend-url")
        }
    }
}
