public import RelayConfig
public import RelayCore

/// Fan-out (docs/contracts.md, Topics), the worker's last step: one delivery record per endpoint whose `app`, `events` and
/// `environments` match a standardized event, keyed `<endpoint id>:<subject>` so one endpoint's
/// deliveries for one subscription stay on one partition, in order.
public struct DeliveryFanOut: Sendable {
    private let endpoints: [RelayConfiguration.Endpoint]
    private let topic: String

    public init(configuration: RelayConfiguration) {
        self.init(endpoints: configuration.endpoints, topic: configuration.topics.deliveries)
    }

    public init(endpoints: [RelayConfiguration.Endpoint], topic: String) {
        self.endpoints = endpoints
        self.topic = topic
    }

    /// The endpoints that take `event` of `app`: `events` lists its type or `*`, `environments` its environment.
    public func endpoints(for event: StandardEvent, app: String) -> [RelayConfiguration.Endpoint] {
        endpoints.filter { endpoint in
            endpoint.app == app && (endpoint.events.contains("*") || endpoint.events.contains(event.type.rawValue))
                && endpoint.environments.contains(event.environment)
        }
    }

    /// The delivery records of `event`: `body` (its encoded payload) as the webhook body, unsigned
    /// (signing happens at send time, so every attempt carries a fresh timestamp).
    public func records(for event: StandardEvent, app: String, body: [UInt8]) -> [OutgoingRecord] {
        return endpoints(for: event, app: app).map { endpoint in
            DeliveryRecord.fresh(
                topic: topic, endpoint: endpoint.id, subject: event.subject, body: body, eventID: event.id, eventType: event.type.rawValue,
                app: app)
        }
    }
}
