import Foundation

/// The subject of a notification: what its Kafka key is made of, so that every notification about one
/// subscription lands on one partition and is processed in order (DESIGN sections 4 and 6).
///
/// Read from the unverified body: this only chooses a partition; verification happens in the worker.
public enum NotificationSubject {
    /// Used when the body names nothing at all (not JSON of the store's shape).
    public static let unknown = "unknown"

    public static func extract(store: Store, body: [UInt8]) -> String {
        extract(store: store, document: JSONValue.parse(body))
    }

    /// The subject from an already parsed body (`JSONValue.parse`), so the ingest parses each body once.
    public static func extract(store: Store, document: JSONValue.Document?) -> String {
        guard let object = document?.value as? [String: Any] else { return unknown }
        let subject: String? =
            switch store {
            case .apple: apple(object)
            case .google: google(object)
            case .stripe: stripe(object)
            case .paddle: paddle(object)
            }
        guard let subject, !subject.isEmpty else { return unknown }
        return subject
    }

    /// `originalTransactionId` from the payload or its nested transaction/renewal JWS, else `notificationUUID`.
    static func apple(_ body: [String: Any]) -> String? {
        guard let jws = body["signedPayload"] as? String, let payload = JWSPayload.decode(jws) else { return nil }
        let data = payload["data"] as? [String: Any]
        if let id = data?["originalTransactionId"] as? String { return id }
        for nestedKey in ["signedTransactionInfo", "signedRenewalInfo"] {
            if let nested = data?[nestedKey] as? String, let decoded = JWSPayload.decode(nested),
                let id = decoded["originalTransactionId"] as? String
            {
                return id
            }
        }
        return payload["notificationUUID"] as? String
    }

    /// `purchaseToken` of the DeveloperNotification in `message.data`, else the Pub/Sub `messageId`.
    static func google(_ body: [String: Any]) -> String? {
        guard let message = body["message"] as? [String: Any] else { return nil }
        if let data = message["data"] as? String, let bytes = Base64.decode(data),
            let notification = JSONValue.object(from: bytes)
        {
            for kind in ["subscriptionNotification", "oneTimeProductNotification", "voidedPurchaseNotification"] {
                if let token = (notification[kind] as? [String: Any])?["purchaseToken"] as? String { return token }
            }
        }
        return (message["messageId"] as? String) ?? (message["message_id"] as? String)
    }

    /// The subscription id (also `parent.subscription_details.subscription` on newer invoices), else the
    /// customer id, else the event id.
    static func stripe(_ event: [String: Any]) -> String? {
        let object = (event["data"] as? [String: Any])?["object"] as? [String: Any]
        if let object {
            if object["object"] as? String == "subscription", let id = object["id"] as? String { return id }
            if let id = idOrExpanded(object["subscription"]) { return id }
            let parent = (object["parent"] as? [String: Any])?["subscription_details"] as? [String: Any]
            if let id = idOrExpanded(parent?["subscription"]) { return id }
            if object["object"] as? String == "customer", let id = object["id"] as? String { return id }
            if let id = idOrExpanded(object["customer"]) { return id }
        }
        return event["id"] as? String
    }

    /// The subscription id, else the customer id, else the event id.
    static func paddle(_ event: [String: Any]) -> String? {
        let type = event["event_type"] as? String ?? ""
        if let data = event["data"] as? [String: Any] {
            if type.hasPrefix("subscription."), let id = data["id"] as? String { return id }
            if let id = data["subscription_id"] as? String { return id }
            if type.hasPrefix("customer."), let id = data["id"] as? String { return id }
            if let id = data["customer_id"] as? String { return id }
        }
        return (event["event_id"] as? String) ?? (event["notification_id"] as? String)
    }

    /// Stripe fields are either an id string or the expanded object with an `id`.
    private static func idOrExpanded(_ value: Any?) -> String? {
        if let id = value as? String { return id }
        return (value as? [String: Any])?["id"] as? String
    }
}

/// Small JSON helpers over Foundation's parser.
public enum JSONValue {
    /// The top-level object of a JSON document, or nil when it is not a JSON object.
    public static func object(from bytes: [UInt8]) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(bytes), options: [])) as? [String: Any]
    }

    /// A parsed JSON document of any kind (RFC 8259 allows any value at top level).
    public struct Document: @unchecked Sendable {
        // Foundation's JSON values (dictionaries, arrays, strings, numbers) are immutable once parsed.
        public let value: Any
    }

    /// The bytes parsed as one JSON value, or nil when they are not JSON.
    public static func parse(_ bytes: [UInt8]) -> Document? {
        (try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])).map(Document.init)
    }
}

/// The payload (middle part) of a compact JWS, decoded without verifying anything.
public enum JWSPayload {
    public static func decode(_ jws: String) -> [String: Any]? {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let bytes = Base64.decode(String(parts[1])) else { return nil }
        return JSONValue.object(from: bytes)
    }
}

/// Base64 decoding that accepts both the standard and the URL-safe alphabet, with or without padding.
public enum Base64 {
    public static func decode(_ text: String) -> [UInt8]? {
        var normalized = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        let remainder = normalized.utf8.count % 4
        if remainder == 1 { return nil }
        if remainder > 0 { normalized += String(repeating: "=", count: 4 - remainder) }
        return Data(base64Encoded: normalized).map(Array.init)
    }
}
