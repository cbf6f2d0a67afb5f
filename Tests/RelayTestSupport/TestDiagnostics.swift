public import Logging
public import Testing

/// Everything a logger was given, as text: for tests that check what a client logs (and never logs).
public final class LogRecorder: Sendable {
    private let records = LockedBox<[String]>([])
    private let label: String

    public init(label: String = "test") {
        self.label = label
    }

    public var text: String { records.value.joined(separator: "\n") }

    public var logger: Logger {
        let records = self.records
        return Logger(label: label) { _ in Handler(records: records) }
    }

    private struct Handler: LogHandler {
        let records: LockedBox<[String]>
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            records.withLock { $0.append("\(event.level) \(event.message) \(event.metadata ?? [:])") }
        }
    }
}

/// Runs `body` and returns the error of type `Failure` it threw; nil, recorded as a test failure, when it
/// threw none or another error.
public func caughtError<Failure: Error>(
    _ type: Failure.Type, _ body: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation
) async -> Failure? {
    do {
        try await body()
        Issue.record("expected a \(Failure.self), got success", sourceLocation: sourceLocation)
    } catch let error as Failure {
        return error
    } catch {
        Issue.record("expected a \(Failure.self), got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}
