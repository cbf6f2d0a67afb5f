import Glibc
public import Logging
import Synchronization

/// Writes each log line to stderr in exactly the format of swift-log's `StreamLogHandler`
/// (`<local time> <level> <label>: <key=value …, sorted> [<source>] <message>`), for less work per line.
///
/// `StreamLogHandler` formats its timestamp with `localtime` and `strftime` for every line; glibc's
/// `localtime` re-reads the time zone's state (a `stat` of `/etc/localtime`) on each call. When the worker
/// logged a line for every notification at info, that was 2% of the relay's CPU at full load. Here the
/// timestamp's text is made once a second with `localtime_r`, which reads the time zone once: a change of
/// `TZ` or `/etc/localtime` takes effect at the next start. Each line is written with one `write(2)`.
///
/// One difference: the logger's metadata is made into text at the first line written with it, not when
/// it is set, so a `.stringConvertible` value whose description changes in between is written as it is
/// then (the relay sets no such value).
public struct LineLogHandler: LogHandler {
    private let label: String
    private let write: @Sendable (String) -> Void

    public var logLevel: Logger.Level = .info
    public var metadataProvider: Logger.MetadataProvider?
    public var metadata = Logger.Metadata() {
        didSet { prettyMetadata = PrettyMetadata() }
    }
    /// The metadata's text, made at the first line logged with it rather than at each change: the ingest
    /// and the worker set a few keys on a logger for every notification and mostly log nothing with it.
    /// Copies of the handler share it until one of them changes its metadata.
    private var prettyMetadata = PrettyMetadata()

    /// Lines to stderr, each whole, as `StreamLogHandler.standardError` writes them.
    public static func standardError(label: String, metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider) -> LineLogHandler {
        LineLogHandler(label: label, metadataProvider: metadataProvider, write: StandardError.write)
    }

    /// `write` receives each whole line, its newline included (tests).
    public init(label: String, metadataProvider: Logger.MetadataProvider?, write: @escaping @Sendable (String) -> Void) {
        self.label = label
        self.metadataProvider = metadataProvider
        self.write = write
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        // The metadata as StreamLogHandler merges it: the logger's, the provider's, the line's, its error.
        let pretty: String?
        let provided = metadataProvider?.get() ?? [:]
        if provided.isEmpty, event.metadata?.isEmpty ?? true, event.error == nil {
            pretty = prettyMetadata.text { Self.prettify(metadata) }
        } else {
            var merged = metadata
            if !provided.isEmpty { merged.merge(provided) { $1 } }
            if let explicit = event.metadata, !explicit.isEmpty { merged.merge(explicit) { $1 } }
            if let error = event.error {
                merged["error.message"] = "\(error)"
                merged["error.type"] = "\(String(reflecting: type(of: error)))"
            }
            pretty = Self.prettify(merged)
        }
        var line = LocalTimestamp.shared.now()
        line += " "
        line += event.level.rawValue
        if !label.isEmpty {
            line += " "
            line += label
        }
        line += ":"
        if let pretty {
            line += " "
            line += pretty
        }
        line += " ["
        line += event.source
        line += "] "
        line += event.message.description
        line += "\n"
        write(line)
    }

    static func prettify(_ metadata: Logger.Metadata) -> String? {
        if metadata.isEmpty { return nil }
        return metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
    }
}

/// A handler's metadata as text, made once when first needed.
private final class PrettyMetadata: Sendable {
    private let made = Mutex<String??>(nil)

    func text(_ make: () -> String?) -> String? {
        if let text = made.withLock({ $0 }) { return text }
        let text = make()
        made.withLock { $0 = text }
        return text
    }
}

/// `%Y-%m-%dT%H:%M:%S%z` in local time for the current second, made once a second.
final class LocalTimestamp: Sendable {
    static let shared = LocalTimestamp()

    private let cached = Mutex<(second: Int, text: String)>((Int.min, ""))

    func now() -> String {
        text(at: time(nil))
    }

    func text(at second: time_t) -> String {
        let key = Int(second)
        if let hit = cached.withLock({ $0.second == key ? $0.text : nil }) { return hit }
        let text = Self.format(second)
        cached.withLock { $0 = (key, text) }
        return text
    }

    /// As StreamLogHandler writes it.
    static func format(_ second: time_t) -> String {
        var second = second
        var local = tm()
        guard localtime_r(&second, &local) != nil else { return "<unknown>" }
        var buffer = [CChar](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &local)
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

enum StandardError {
    /// One line at a time, so that lines from different threads never interleave (swift-log's stream locks
    /// the `FILE` for the same reason).
    private static let lock = Mutex(())

    /// The whole line to file descriptor 2, as stderr's unbuffered stream writes it.
    @Sendable static func write(_ line: String) {
        write(line, to: 2)
    }

    static func write(_ line: String, to descriptor: Int32) {
        var line = line
        line.withUTF8 { bytes in
            lock.withLock { _ in
                var offset = 0
                while offset < bytes.count {
                    let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                    if written > 0 {
                        offset += written
                    } else if written < 0, errno == EINTR {
                        continue
                    } else {
                        return  // stderr closed or full: the line is lost, as with fwrite
                    }
                }
            }
        }
    }
}
