import Foundation

/// The vocabulary of purchases an app hands over (`POST /subscriptions-api/public/v1/users/{id}/purchases`),
/// shared by the local backend that takes them, the verifier and the updater that applies them.
///
/// The backend appends a raw notification record with `relay-source: app-purchase` to
/// `relay.notifications`, keyed like the store's own notifications of the same subscription, whose body is
/// `{"purchaseId", "appUserId", "transferPolicy", ...the store's fields}`:
/// - Apple: `"signedTransaction"`, StoreKit 2's `jwsRepresentation`, verified again by the worker;
/// - Google: `"productId"`, `"purchaseToken"` (read from the Play Developer API by the worker).
///
/// The worker maps it as the store's own notification of that transaction (a first purchase, a renewal
/// or a one-time purchase): a payment the subscription already recorded sends no second event, whichever
/// came first. Then it binds the subscription to `appUserId` by the app's transfer policy
/// (`SubscriptionState.ownerAppUserId`).
public enum AppPurchase {
    /// `relay-source` of the records the local backend appends.
    public static let source = "app-purchase"

    /// Who handed the purchase over, and what the app's policy said when it did.
    public struct Purchaser: Sendable, Equatable {
        /// The id in the route's path (an app user id, an alias or a device id).
        public var appUserId: String
        /// `transfer` or `keep` (`apps[].transferPolicy`).
        public var transferPolicy: String
        /// The route's own id of this hand-over: the notification id its events derive from.
        public var purchaseId: String

        public init(appUserId: String, transferPolicy: String, purchaseId: String) {
            self.appUserId = appUserId
            self.transferPolicy = transferPolicy
            self.purchaseId = purchaseId
        }

        /// Whether a purchase another user has may move to this one.
        public var transfers: Bool { transferPolicy != "keep" }

        /// Read from a record's body; nil when it lacks any of the three.
        public init?(body document: JSON) {
            guard let user = document["appUserId"]?.stringValue, !user.isEmpty, let id = document["purchaseId"]?.stringValue, !id.isEmpty else {
                return nil
            }
            self.init(appUserId: user, transferPolicy: document["transferPolicy"]?.stringValue ?? "transfer", purchaseId: id)
        }

        /// The members the record's body carries.
        public var members: [String: JSON] {
            ["appUserId": .string(appUserId), "transferPolicy": .string(transferPolicy), "purchaseId": .string(purchaseId)]
        }
    }

    /// Whether two user ids are the same id: equal, or the same UUID written in another case (Apple's
    /// `appAccountToken` is a UUID, which the app may spell in upper case).
    public static func sameId(_ first: String, _ second: String) -> Bool {
        if first == second { return true }
        guard first.utf8.count == 36, second.utf8.count == 36, let one = UUID(uuidString: first), let other = UUID(uuidString: second) else {
            return false
        }
        return one == other
    }

    /// The notification id of a hand-over: `purchase:<purchaseId>`.
    public static func notificationId(_ purchaseId: String) -> String { "purchase:\(purchaseId)" }

    /// The user id the subscription is bound to now: the owner an app set, else the store's user (nil:
    /// nobody, or the anonymous id).
    public static func holder(of state: SubscriptionState?) -> String? {
        guard let state else { return nil }
        if let owner = state.ownerAppUserId { return owner }
        if let user = state.originalAppUserId, !SubscriptionState.isAnonymous(user) { return user }
        return nil
    }
}
