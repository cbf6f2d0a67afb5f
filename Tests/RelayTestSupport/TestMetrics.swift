public import CoreMetrics
public import Synchronization

/// A metrics factory that counts what it makes and keeps each counter's value, for tests that check a
/// metric moved.
public final class TestMetrics: MetricsFactory, Sendable {
    public init() {}

    public final class Handler: CounterHandler, RecorderHandler, TimerHandler, Sendable {
        public let total = Mutex<Int64>(0)
        public func increment(by amount: Int64) { total.withLock { $0 += amount } }
        public func reset() { total.withLock { $0 = 0 } }
        public func record(_ value: Int64) {}
        public func record(_ value: Double) {}
        public func recordNanoseconds(_ duration: Int64) {}
    }

    public let made = Mutex(0)
    private let handlers = Mutex<[String: Handler]>([:])

    public func value(of label: String, _ values: [String]) -> Int64? {
        handlers.withLock { $0[([label] + values).joined(separator: "|")] }?.total.withLock { $0 }
    }

    public func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        made.withLock { $0 += 1 }
        let key = ([label] + dimensions.map(\.1)).joined(separator: "|")
        return handlers.withLock { handlers in
            if let existing = handlers[key] { return existing }
            let handler = Handler()
            handlers[key] = handler
            return handler
        }
    }
    public func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler { Handler() }
    public func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler { Handler() }
    public func destroyCounter(_ handler: any CounterHandler) {}
    public func destroyRecorder(_ handler: any RecorderHandler) {}
    public func destroyTimer(_ handler: any TimerHandler) {}
}
