import CoreMetrics
import RelayCore

/// The normalizer's metrics, each made once (the event builder counts events and missing rates).
struct NormalizerCounters: Sendable {
    let unmapped: LabeledCounters
    let writeConflicts: LabeledCounters
    let events: LabeledCounters
    let exchangeRateMissing: LabeledCounters
    let playAPIErrors: LabeledCounters
    let stripeAPIErrors: LabeledCounters
    let paddleAPIErrors: LabeledCounters
    /// `relay_play_purchases_acknowledged_total`: purchases the relay acknowledged (`playApi.acknowledgePurchases`).
    let acknowledged: LabeledCounters

    init(_ factory: any MetricsFactory) {
        unmapped = LabeledCounters(label: "relay_notifications_unmapped_total", factory: factory)
        writeConflicts = LabeledCounters(label: "relay_backend_write_conflicts_total", factory: factory)
        events = LabeledCounters(label: "relay_events_total", factory: factory)
        exchangeRateMissing = LabeledCounters(label: "relay_exchange_rate_missing_total", factory: factory)
        playAPIErrors = LabeledCounters(label: "relay_play_api_errors_total", factory: factory)
        stripeAPIErrors = LabeledCounters(label: "relay_stripe_api_errors_total", factory: factory)
        paddleAPIErrors = LabeledCounters(label: "relay_paddle_api_errors_total", factory: factory)
        acknowledged = LabeledCounters(label: "relay_play_purchases_acknowledged_total", factory: factory)
    }

    /// Counts a store API failure under its API's metric.
    func storeAPIError(_ error: StoreAPIError) {
        switch error.api {
        case .play: playAPIErrors.increment([("kind", error.kind.rawValue)])
        case .stripe: stripeAPIErrors.increment([("kind", error.kind.rawValue)])
        case .paddle: paddleAPIErrors.increment([("kind", error.kind.rawValue)])
        case .appStore: break
        }
    }
}
