import RelayCore

/// A Stripe or Paddle purchase an app handed over (`AppPurchase`), as the store's own notification of it:
/// the worker reads the purchase from the store's API (`StoreAPIData.purchase`, recorded with the applied
/// notification so that a repeat maps the same) and maps the event the store sends for it, through the
/// store's own table.
///
/// - Stripe: a subscription (given, or a subscription-mode Checkout Session's) is
///   `customer.subscription.created`; a payment-mode Checkout Session is `checkout.session.completed`.
/// - Paddle: a transaction of a subscription is that subscription's `subscription.created` (naming the
///   transaction when it is the checkout that created it); any other transaction is `transaction.completed`.
///
/// The event's time is when the relay received the hand-over.
enum HandedOverPurchase {
    /// The store event for `purchase` (what the API answered); an event no table maps when there is none.
    static func event(store: Store, purchase: JSON?, notificationId: String?) -> JSON {
        let id = JSON.string(notificationId ?? "purchase")
        switch store {
        case .stripe:
            if let subscription = purchase?.present("subscription") {
                return [
                    "id": id, "object": "event", "type": "customer.subscription.created",
                    "livemode": subscription["livemode"] ?? true, "data": ["object": subscription],
                ]
            }
            if let session = purchase?.present("checkoutSession") {
                return [
                    "id": id, "object": "event", "type": "checkout.session.completed", "livemode": session["livemode"] ?? true,
                    "data": ["object": session],
                ]
            }
        case .paddle:
            let transaction = purchase?.present("transaction")
            if case .object(var subscription) = purchase?.present("subscription") {
                if let transaction, ["web", "api"].contains(transaction.text("origin") ?? ""), let transactionId = transaction["id"] {
                    subscription["transaction_id"] = transactionId
                }
                return ["event_id": id, "event_type": "subscription.created", "data": .object(subscription)]
            }
            if let transaction { return ["event_id": id, "event_type": "transaction.completed", "data": transaction] }
        case .apple, .google, .promotional:
            break
        }
        return ["type": "relay.purchase.unknown", "event_type": "relay.purchase.unknown"]
    }

    /// What the checkout mapping reads of a Checkout Session, and nothing else: the answer is recorded with
    /// the notification, and the customer's e-mail, name and address must not be (the country is).
    static func trimmedSession(_ session: JSON) -> JSON {
        var kept: [String: JSON] = [:]
        for key in ["id", "object", "mode", "status", "payment_status", "payment_intent", "subscription", "metadata", "client_reference_id",
            "amount_total", "currency", "livemode", "created"]
        {
            if let value = session[key] { kept[key] = value }
        }
        if let tax = session["total_details"]?["amount_tax"] { kept["total_details"] = ["amount_tax": tax] }
        if let country = session["customer_details"]?["address"]?["country"] { kept["customer_details"] = ["address": ["country": country]] }
        return .object(kept)
    }

    /// What the Paddle mappings read of a transaction, and nothing else: its billing details, address,
    /// business and payments (card details, the cardholder's name) must not be recorded.
    static func trimmedTransaction(_ transaction: JSON) -> JSON {
        var kept: [String: JSON] = [:]
        for key in ["id", "status", "origin", "subscription_id", "customer_id", "currency_code", "custom_data", "billed_at", "created_at",
            "discount_id", "billing_period", "collection_mode"]
        {
            if let value = transaction[key] { kept[key] = value }
        }
        if let items = transaction["items"]?.arrayValue {
            kept["items"] = .array(items.map { item in ["price": item["price"] ?? .null, "price_id": item["price_id"] ?? .null, "quantity": item["quantity"] ?? .null] })
        }
        if let details = transaction["details"] {
            kept["details"] = ["totals": details["totals"] ?? .null, "line_items": details["line_items"] ?? .null]
        }
        return .object(kept)
    }

    /// Whether the store's own table maps this hand-over (Stripe's and Paddle's read the store's API).
    static func readsStoreAPI(_ notification: VerifiedNotification) -> Bool {
        notification.purchaser != nil && (notification.store == .stripe || notification.store == .paddle)
    }
}
