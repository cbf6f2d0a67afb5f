public import RelayCore

/// The standardized event types (docs/contracts.md, the standardized event).
public enum EventType: String, Sendable, CaseIterable {
    case initialPurchase = "initial_purchase"
    case renewal
    case cancellation
    case uncancellation
    case expiration
    case billingIssue = "billing_issue"
    case productChange = "product_change"
    case subscriptionPaused = "subscription_paused"
    case nonRenewingPurchase = "non_renewing_purchase"
    case subscriptionExtended = "subscription_extended"
    case refundReversed = "refund_reversed"
    case subscriptionStatusDidChange = "subscription_status_did_change"
}

/// One standardized event: the webhook payload of docs/contracts.md, the standardized event, and the value of a `relay.events`
/// record.
public struct StandardEvent: Sendable, Equatable {
    public var type: EventType
    /// `data.id`: the same store notification always yields the same id (`<store>:<notification id>:<type>`).
    public var id: String
    /// The Kafka key on `relay.events`: the subscription's subject (its `originalTransactionId`).
    public var subject: String
    /// `PRODUCTION` or `SANDBOX` (endpoints filter on it).
    public var environment: String
    /// The whole payload: `{"object": "event", "type", "projectId", "applicationId", "timestamp", "data"}`.
    public var payload: JSON

    public init(type: EventType, id: String, subject: String, environment: String, payload: JSON) {
        self.type = type
        self.id = id
        self.subject = subject
        self.environment = environment
        self.payload = payload
    }

    public var data: JSON { payload["data"] ?? .null }
}

/// The SDK's `subscriptionStatus` shape: `{"status": "UNKNOWN"|"INACTIVE"|"ACTIVE", "entitlements": [...]}`.
public struct SubscriptionStatus: Sendable, Equatable {
    /// Entitlement identifiers, sorted.
    public var entitlements: [String]

    public init(entitlements: some Sequence<String>) {
        self.entitlements = Array(Set(entitlements)).sorted()
    }

    public var status: String { entitlements.isEmpty ? "INACTIVE" : "ACTIVE" }

    public var json: JSON {
        ["status": .string(status), "entitlements": Self.entitlementList(entitlements)]
    }

    /// `[{"id": "pro", "type": "SERVICE_LEVEL"}, ...]`.
    static func entitlementList(_ identifiers: [String]) -> JSON {
        .array(identifiers.map { ["id": .string($0), "type": "SERVICE_LEVEL"] })
    }
}

extension SubscriptionState {
    /// Whether the state gives access, judged by its status alone: transitions come from the store's
    /// notifications, so a renewal a few seconds after the old period's end is not an outage.
    var grantsAccess: Bool { status == .active || status == .inGracePeriod }
}
