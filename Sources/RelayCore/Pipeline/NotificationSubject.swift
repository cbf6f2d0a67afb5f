/// The subject of a notification: what its Kafka key is made of, so that every notification about one
/// subscription lands on one partition and is processed in order (docs/contracts.md (the raw record) and docs/verification.md).
///
/// Read from the unverified body: this only chooses a partition; verification happens in the worker.
public enum NotificationSubject {
    /// Used when the body names nothing at all (not JSON of the store's shape).
    public static let unknown = "unknown"

    public static func extract(store: Store, body: [UInt8]) -> String {
        extract(store: store, document: try? JSON.parse(body))
    }

    /// The subject from an already parsed body, so the ingest parses each body once.
    public static func extract(store: Store, document: JSON?) -> String {
        guard let document, case .object = document else { return unknown }
        let subject: String? =
            switch store {
            case .apple: apple(document)
            case .google: google(document)
            case .stripe: stripe(document)
            case .paddle: paddle(document)
            case .promotional: document["grantId"]?.stringValue
            }
        guard let subject, !subject.isEmpty else { return unknown }
        return subject
    }

    /// `originalTransactionId` from the payload or its nested transaction/renewal JWS, else `notificationUUID`.
    /// Only these members of the payloads are built: the rest are checked and skipped (for every Apple
    /// notification the ingest receives; `revenue-relay-bench ingest`'s subject 10.3 → 8.5 µs).
    static func apple(_ body: JSON) -> String? {
        guard let jws = body["signedPayload"]?.stringValue, let payload = JWSPayload.decode(jws, keepingMembersNamed: payloadMembers) else {
            return nil
        }
        let data = payload["data"]
        if let id = data?["originalTransactionId"]?.stringValue { return id }
        for nestedKey in ["signedTransactionInfo", "signedRenewalInfo"] {
            if let nested = data?[nestedKey]?.stringValue,
                let id = JWSPayload.decode(nested, keepingMembersNamed: nestedMembers)?["originalTransactionId"]?.stringValue
            {
                return id
            }
        }
        return payload["notificationUUID"]?.stringValue
    }

    private static let payloadMembers: JSON.MemberNames = ["data", "originalTransactionId", "signedTransactionInfo", "signedRenewalInfo", "notificationUUID"]
    private static let nestedMembers: JSON.MemberNames = ["originalTransactionId"]

    /// `purchaseToken` of the DeveloperNotification in `message.data`, else the Pub/Sub `messageId`.
    static func google(_ body: JSON) -> String? {
        guard let message = body["message"] else { return nil }
        if let data = message["data"]?.stringValue, let bytes = Base64.decode(data),
            let notification = try? JSON.parse(bytes)
        {
            for kind in ["subscriptionNotification", "oneTimeProductNotification", "voidedPurchaseNotification"] {
                if let token = notification[kind]?["purchaseToken"]?.stringValue { return token }
            }
        }
        return message["messageId"]?.stringValue ?? message["message_id"]?.stringValue
    }

    /// The subscription id (also `parent.subscription_details.subscription` on newer invoices), else the
    /// customer id, else the event id.
    static func stripe(_ event: JSON) -> String? {
        if let object = event["data"]?["object"] {
            let kind = object["object"]?.stringValue
            if kind == "subscription", let id = object["id"]?.stringValue { return id }
            if let id = idOrExpanded(object["subscription"]) { return id }
            if let id = idOrExpanded(object["parent"]?["subscription_details"]?["subscription"]) { return id }
            if kind == "customer", let id = object["id"]?.stringValue { return id }
            if let id = idOrExpanded(object["customer"]) { return id }
        }
        return event["id"]?.stringValue
    }

    /// The subscription id, else the customer id, else the event id.
    static func paddle(_ event: JSON) -> String? {
        let type = event["event_type"]?.stringValue ?? ""
        if let data = event["data"] {
            if type.hasPrefix("subscription."), let id = data["id"]?.stringValue { return id }
            if let id = data["subscription_id"]?.stringValue { return id }
            if type.hasPrefix("customer."), let id = data["id"]?.stringValue { return id }
            if let id = data["customer_id"]?.stringValue { return id }
        }
        return event["event_id"]?.stringValue ?? event["notification_id"]?.stringValue
    }

    /// Stripe fields are either an id string or the expanded object with an `id`.
    private static func idOrExpanded(_ value: JSON?) -> String? {
        value?.stringValue ?? value?["id"]?.stringValue
    }
}
