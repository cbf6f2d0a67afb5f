import Foundation
public import Logging
import RelayCore

/// The logging of a relay process and its tools, set up once at start: `revenue-relay`'s commands and the
/// benchmark's relay (`revenue-relay-bench e2e`) log the same way, so the benchmark measures what runs.
///
/// Lines go to stderr in swift-log's `StreamLogHandler` format (`LineLogHandler`; stdout is for the lines other
/// programs read: dev's addresses), at the level `LOG_LEVEL`
/// names (trace … critical) or else `defaultLevel`, and at most five identical lines per ten seconds: a
/// condition that repeats (an unreachable broker, failing connections) is reported without filling the disk.
public func bootstrapLogging(defaultLevel: Logger.Level = .info) {
    let level = ProcessInfo.processInfo.environment["LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? defaultLevel
    let limiter = RepeatLimitingLogHandler.Limiter()
    LoggingSystem.bootstrap { label in
        var handler = LineLogHandler.standardError(label: label)
        handler.logLevel = level
        return RepeatLimitingLogHandler(label: label, upstream: handler, limiter: limiter)
    }
}
