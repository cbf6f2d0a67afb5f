import RelayCore

/// What applying a purchase an app handed over (`AppPurchase`) did to who has the subscription,
/// recorded with the applied notification so that a repeat yields the same events.
///
/// The hand-over binds the subscription to the user it came from:
/// - **nobody had it** (the store carried no user id): the user becomes its `originalAppUserId`;
/// - **the same user had it** (the id itself, or another id linked to the same user): nothing changes;
/// - **another user had it**: under `transfer` the user becomes its `ownerAppUserId` and the other user
///   loses it (both get `subscription_status_did_change`, the events carry `transferredFrom`); under
///   `keep` nothing changes (the route answers 409 `owned_by_another_user`).
struct PurchaseBinding: Sendable, Equatable {
    /// Whether the state before counted for the user the events name: false when the hand-over gave the
    /// subscription to a user it did not feed, whose status then starts from that user's other subscriptions.
    var priorCounted: Bool
    /// A transfer: the user who had it.
    var transferredFrom: TransferredFrom?

    struct TransferredFrom: Sendable, Equatable {
        /// The user as its ids resolve (the one an app linked the held id to).
        var user: AppUser
        /// The entitlements of that user's other active subscriptions.
        var others: [String]
    }

    /// What a hand-over by `purchaser` does to `next` (the state the notification leads to), given
    /// whether the user holding it is the purchaser's user (`sameUser`, from their ids); `now` is when the
    /// app handed it over (the record's receive time).
    static func decide(
        purchaser: AppPurchase.Purchaser, prior: SubscriptionState?, next: inout SubscriptionState, now: Int64, sameUser: Bool
    ) -> (binding: PurchaseBinding, transferFrom: String?) {
        // An App Store subscription handed over after its end (a restore of a lapsed one) gives no access:
        // Apple's transaction says only when it expires.
        if next.store == .apple, next.status == .active, let expires = next.expiresAt, expires <= now { next.status = .expired }
        let holder = AppPurchase.holder(of: next)
        guard let holder else {
            next.originalAppUserId = purchaser.appUserId
            return (PurchaseBinding(priorCounted: prior == nil), nil)
        }
        if sameUser {
            // The store's UUID as the app spells it (another case): the app asks with its own spelling.
            if holder != purchaser.appUserId, AppPurchase.sameId(holder, purchaser.appUserId) { next.ownerAppUserId = purchaser.appUserId }
            return (PurchaseBinding(priorCounted: true), nil)
        }
        if !purchaser.transfers { return (PurchaseBinding(priorCounted: true), nil) }
        next.ownerAppUserId = purchaser.appUserId
        return (PurchaseBinding(priorCounted: false), holder)
    }

    var json: JSON {
        var members: [String: JSON] = ["priorCounted": .bool(priorCounted)]
        if let transferredFrom {
            members["from"] = ["user": transferredFrom.user.json, "others": .array(transferredFrom.others.map(JSON.string))]
        }
        return .object(members)
    }

    init(priorCounted: Bool, transferredFrom: TransferredFrom? = nil) {
        self.priorCounted = priorCounted
        self.transferredFrom = transferredFrom
    }

    init?(json: JSON) {
        guard let counted = json["priorCounted"]?.boolValue else { return nil }
        priorCounted = counted
        if let from = json["from"], let user = from["user"].flatMap(AppUser.init(json:)) {
            transferredFrom = TransferredFrom(user: user, others: from["others"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        }
    }
}
