import Logging
@testable import RelayCore
import Synchronization
import Testing

/// Collects what reaches the real handler.
private final class Collected: Sendable {
    let lines = Mutex<[(message: String, metadata: Logger.Metadata)]>([])
}

private struct CollectingHandler: LogHandler {
    let collected: Collected
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) {
        collected.lines.withLock { $0.append(("\(event.message)", event.metadata ?? [:])) }
    }
}

@Suite struct RepeatLimitingLogHandlerTests {
    @Test func aRepeatedLineIsLimitedAndTheNextOneAfterTheWindowCountsWhatWasLeftOut() {
        let start = ContinuousClock.now
        let clock = Mutex(start)
        let limiter = RepeatLimitingLogHandler.Limiter(burst: 3, window: .seconds(10), now: { clock.withLock { $0 } })
        let collected = Collected()
        let logger = Logger(label: "test") { label in
            RepeatLimitingLogHandler(label: label, upstream: CollectingHandler(collected: collected), limiter: limiter)
        }
        for _ in 0..<1000 {
            logger.error("connect failed", metadata: ["broker": "127.0.0.1:9092"])
        }
        // A different line, or the same message with other metadata, is not held back by the first.
        logger.error("connect failed", metadata: ["broker": "127.0.0.1:9093"])
        logger.warning("something else")
        var lines = collected.lines.withLock { $0 }
        #expect(lines.count == 5)
        #expect(lines.filter { $0.metadata["broker"] == "127.0.0.1:9092" }.count == 3)
        #expect(lines.allSatisfy { $0.metadata["log.suppressed"] == nil })

        clock.withLock { $0 = start + .seconds(11) }
        logger.error("connect failed", metadata: ["broker": "127.0.0.1:9092"])
        lines = collected.lines.withLock { $0 }
        #expect(lines.count == 6)
        #expect(lines.last?.metadata["log.suppressed"] == "997")
        #expect(lines.last?.metadata["broker"] == "127.0.0.1:9092")
    }

    @Test func linesThatDifferOnlyInTheLoggersMetadataAreCountedApart() {
        let limiter = RepeatLimitingLogHandler.Limiter(burst: 2, window: .seconds(10))
        let collected = Collected()
        var apple = Logger(label: "test") { label in
            RepeatLimitingLogHandler(label: label, upstream: CollectingHandler(collected: collected), limiter: limiter)
        }
        apple[metadataKey: "notification.store"] = "apple"
        var stripe = apple
        stripe[metadataKey: "notification.store"] = "stripe"
        for _ in 0..<10 { apple.warning("notification not acknowledged by the log") }
        for _ in 0..<10 { stripe.warning("notification not acknowledged by the log") }
        #expect(collected.lines.withLock { $0.count } == 4)
    }

    /// A line is known by a hash of its parts: the same parts in any order of metadata are one line; a
    /// difference in any part, or a name and value swapped, is another.
    @Test func aLinesIdentityIsItsPartsWhateverTheMetadatasOrder() {
        struct Failure: Error, CustomStringConvertible { var description: String }
        func key(
            label: String = "relay", level: Logger.Level = .warning, message: Logger.Message = "connect failed",
            _ metadata: [(String, Logger.MetadataValue)] = [("broker", "a:1"), ("topic", "t")], error: (any Error)? = nil
        ) -> Int {
            let event = LogEvent(level: level, message: message, error: error, metadata: nil, source: "s", file: "f", function: "g", line: 1)
            return RepeatLimitingLogHandler.key(label: label, event: event, metadata: Logger.Metadata(uniqueKeysWithValues: metadata))
        }
        let base = key()
        #expect(key([("topic", "t"), ("broker", "a:1")]) == base)
        let others = [
            key(label: "other"), key(level: .error), key(message: "connect refused"), key([("broker", "a:2"), ("topic", "t")]),
            key([("broker", "a:1")]), key([("broker", "a:1"), ("topic", "t"), ("x", "")]), key([("a:1", "broker"), ("topic", "t")]),
            key(error: Failure(description: "timed out")),
        ]
        for other in others { #expect(other != base) }
        #expect(Set(others).count == others.count)
    }
}
