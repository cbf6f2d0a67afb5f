import CoreMetrics
import DequeModule
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
import ServiceLifecycle
import Synchronization

/// Counts dispatched records until their outcome is durable, for a graceful shutdown.
final class InFlightTracker: Sendable {
    private let value = Atomic<Int>(0)
    var count: Int { value.load(ordering: .acquiring) }
    func begin() { value.add(1, ordering: .relaxed) }
    func end() { value.subtract(1, ordering: .releasing) }
    func abandon(_ count: Int) { value.subtract(count, ordering: .releasing) }
}

/// Per-endpoint metrics, created once (the endpoint label is bounded by the configuration).
struct EndpointCounters: Sendable {
    let delivered: Counter
    let failed: Counter
    let retried: Counter
    let deferred: Counter
    let throttled: Counter
    let duration: Timer
    let circuitOpen: Gauge

    init(endpoint: String, metrics: any MetricsFactory) {
        func outcome(_ name: String) -> Counter {
            Counter(label: "relay_deliveries_total", dimensions: [("endpoint", endpoint), ("outcome", name)], factory: metrics)
        }
        delivered = outcome("delivered")
        failed = outcome("attempt_failed")
        retried = outcome("retry_scheduled")
        deferred = outcome("deferred")
        throttled = outcome("throttled")
        duration = Timer(label: "relay_delivery_duration_seconds", dimensions: [("endpoint", endpoint)], preferredDisplayUnit: .seconds, factory: metrics)
        circuitOpen = Gauge(label: "relay_endpoint_circuit_open", dimensions: [("endpoint", endpoint)], factory: metrics)
    }
}

struct DeliveryCounters: Sendable {
    private let deadLetters: LabeledCounters

    init(metrics: any MetricsFactory) {
        deadLetters = LabeledCounters(label: "relay_deliveries_dead_lettered_total", factory: metrics)
    }

    func deadLettered(endpoint: String, reason: DeadLetterReason) {
        deadLetters.increment([("endpoint", endpoint), ("reason", reason.rawValue)])
    }
}
