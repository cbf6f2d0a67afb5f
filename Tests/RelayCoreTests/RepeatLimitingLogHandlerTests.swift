import Logging
import RelayCore
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
}
