import CoreMetrics
import RelayCore

/// The ingest's metrics; labels are bounded (store, HTTP status).
struct IngestMetrics: Sendable {
    let factory: any MetricsFactory

    func request(store: Store, status: Int) {
        Counter(label: "relay_ingest_requests_total", dimensions: [("store", store.rawValue), ("status", String(status))], factory: factory)
            .increment()
    }

    func acknowledged(store: Store, after duration: Duration) {
        Timer(label: "relay_ingest_ack_duration", dimensions: [("store", store.rawValue)], factory: factory)
            .recordNanoseconds(duration.wholeNanoseconds)
    }
}
