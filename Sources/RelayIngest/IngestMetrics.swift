import CoreMetrics
import RelayCore

/// The ingest's metrics; labels are bounded (store, HTTP status). Made once per server, each counter
/// and timer once per label values.
struct IngestMetrics: Sendable {
    private let requests: LabeledCounters
    private let refusals: LabeledCounters
    private let ackDurations: [Store: Timer]

    /// Why a request was refused before it was written (`relay_ingest_refused_total{store,reason}`).
    enum Refusal: String, Sendable {
        case sourceNotAllowed = "source_not_allowed"
        case rateLimited = "rate_limited"
        case notJSON = "not_json"
        case notANotification = "not_a_notification"
        case unverifiedBytes = "too_much_unverified"
        case logFull = "log_full"
    }

    init(factory: any MetricsFactory) {
        requests = LabeledCounters(label: "relay_ingest_requests_total", factory: factory)
        refusals = LabeledCounters(label: "relay_ingest_refused_total", factory: factory)
        ackDurations = Dictionary(
            uniqueKeysWithValues: Store.notificationStores.map { ($0, Timer(label: "relay_ingest_ack_duration", dimensions: [("store", $0.rawValue)], factory: factory)) })
    }

    func request(store: Store, status: Int) {
        requests.increment([("store", store.rawValue), ("status", String(status))])
    }

    func refused(store: Store, reason: Refusal) {
        refusals.increment([("store", store.rawValue), ("reason", reason.rawValue)])
    }

    func acknowledged(store: Store, after duration: Duration) {
        ackDurations[store]?.recordNanoseconds(duration.wholeNanoseconds)
    }
}
