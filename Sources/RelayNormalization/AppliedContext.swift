import RelayCore

/// What the normalizer recorded when it applied a notification (`recentNotifications[].context`).
struct AppliedContext {
    var receivedAt: Int64
    var prior: SubscriptionState?
    var others: [String]
    /// The other subscriptions' entitlements once applied (without a subscription the notification replaced).
    var othersAfter: [String]
    /// The store APIs' answers the notification was mapped with.
    var api: StoreAPIData?
    /// The subscription's sequence number its events carried (the version its write gave the state); nil
    /// in contexts recorded before events carried one.
    var sequence: Int64?
    /// The app user the subscription's user id stood for, with its ids and attributes, when it had one.
    var appUser: AppUser?
    /// A purchase an app handed over: what it did to who has the subscription.
    var binding: PurchaseBinding?

    /// `transactionsRead`: the prior state's recorded payments the mapping looked up; only those are kept.
    init(
        receivedAt: Int64, prior: SubscriptionState?, others: [String], othersAfter: [String], api: StoreAPIData?, transactionsRead: [String],
        sequence: Int64?
    ) {
        self.sequence = sequence
        self.receivedAt = receivedAt
        self.prior = prior.map {
            var stripped = $0
            stripped.recentNotifications = []
            stripped.transactions = $0.transactions.filter { transactionsRead.contains($0.id) }
            stripped.version = 0
            return stripped
        }
        self.others = others
        self.othersAfter = othersAfter
        self.api = api
    }

    /// A context as `json` wrote it; nil when it is not one (the repeat is then mapped afresh).
    init?(_ json: JSON) {
        guard let receivedAt = json["receivedAt"]?.int64Value else { return nil }
        self.receivedAt = receivedAt
        if let prior = json["prior"], !prior.isNull {
            guard let state = try? SubscriptionState(json: prior) else { return nil }
            self.prior = state
        } else {
            self.prior = nil
        }
        self.others = json["others"]?.arrayValue?.compactMap(\.stringValue) ?? []
        // Recorded only when it differs (contexts from before replacements were tracked have none).
        self.othersAfter = json["othersAfter"]?.arrayValue?.compactMap(\.stringValue) ?? others
        self.sequence = json["sequence"]?.int64Value
        self.appUser = json["appUser"].flatMap { AppUser(json: $0) }
        self.binding = json["binding"].flatMap { PurchaseBinding(json: $0) }
        // "play": what earlier versions recorded (Google's answers only).
        if let api = json.present("api") ?? json.present("play") { self.api = StoreAPIData(api) }
    }

    /// The context as stored: written with every notification that changes a state, so built as a
    /// `JSON` value directly (through JSONEncoder and back it cost more than the rest of the write).
    var json: JSON {
        var members: [String: JSON] = ["receivedAt": .integer(receivedAt), "prior": prior?.json ?? .null, "others": .array(others.map(JSON.string))]
        if othersAfter != others { members["othersAfter"] = .array(othersAfter.map(JSON.string)) }
        if let sequence { members["sequence"] = .integer(sequence) }
        if let appUser { members["appUser"] = appUser.json }
        if let binding { members["binding"] = binding.json }
        if let api { members["api"] = api.json }
        return .object(members)
    }
}
