import CoreMetrics
import RelayCore

/// The ingest's metrics; labels are bounded (store, HTTP status). Made once per server, each counter
/// and timer once per label values.
struct IngestMetrics: Sendable {
    private let requests: LabeledCounters
    private let ackDurations: [Store: Timer]

    init(factory: any MetricsFactory) {
        requests = LabeledCounters(label: "relay_ingest_requests_total", factory: factory)
        ackDurations = Dictionary(
            uniqueKeysWithValues: Store.allCases.map { ($0, Timer(label: "relay_ingest_ack_duration", dimensions: [("store", $0.rawValue)], factory: factory)) })
    }

    func request(store: Store, status: Int) {
        requests.increment([("store", store.rawValue), ("status", String(status))])
    }

    func acknowledged(store: Store, after duration: Duration) {
        ackDurations[store]?.recordNanoseconds(duration.wholeNanoseconds)
    }
}
