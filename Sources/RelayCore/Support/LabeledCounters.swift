public import CoreMetrics
import Synchronization

/// The counters of one metric, one per set of label values, each made once and kept: making a
/// `Counter` asks the metrics factory (a registry lookup under its lock) every time, which per record
/// and per event was work for nothing.
public final class LabeledCounters: Sendable {
    private let label: String
    private let factory: any MetricsFactory
    private let counters = Mutex<[[String]: Counter]>([:])

    public init(label: String, factory: any MetricsFactory) {
        self.label = label
        self.factory = factory
    }

    /// Increments the counter with these label values (names and values, in a fixed order per call site).
    public func increment(_ dimensions: [(String, String)] = [], by amount: Int64 = 1) {
        let key = dimensions.map(\.1)
        if let counter = counters.withLock({ $0[key] }) {
            counter.increment(by: amount)
            return
        }
        let counter = Counter(label: label, dimensions: dimensions, factory: factory)
        counters.withLock { $0[key] = counter }
        counter.increment(by: amount)
    }
}
