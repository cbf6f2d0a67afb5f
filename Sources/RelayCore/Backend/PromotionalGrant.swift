/// The vocabulary of promotional grants (`POST/DELETE /subscriptions-api/internal/v1/users/{id}/grants`),
/// shared by the local backend that takes them and schedules their end, the verifier and the mapping.
///
/// The backend appends raw notification records with `relay-store: promotional` and `relay-source: grant`
/// to `relay.notifications`, keyed `promotional:<grantId>`, whose body is
/// `{"action": "grant" | "revoke" | "expire", "grantId", "appUserId", "entitlement", "expiresAt"?, "reason"?, "at"}`.
/// The worker writes a subscription of store `promotional` (product `$promotional:<entitlement>`), so
/// customer info, `subscription_status_did_change` and the events come from the same machinery as purchases.
public enum PromotionalGrant {
    /// `relay-source` of the records the backend appends.
    public static let source = "grant"
    /// The product a grant of `entitlement` is: the local backend maps it to that entitlement alone.
    public static func productId(entitlement: String) -> String { "\(productPrefix)\(entitlement)" }
    public static let productPrefix = "$promotional:"

    /// The entitlement a grant's product stands for; nil for any other product.
    public static func entitlement(ofProductId productId: String) -> String? {
        guard productId.hasPrefix(productPrefix) else { return nil }
        let entitlement = String(productId.dropFirst(productPrefix.count))
        return entitlement.isEmpty ? nil : entitlement
    }

    public enum Action: String, Sendable, CaseIterable {
        /// The grant is made: `non_renewing_purchase` (price 0), the status change.
        case grant
        /// Revoked through the DELETE route: `expiration` (DEVELOPER_INITIATED), the status change.
        case revoke
        /// Its time ran out (the backend's schedule): `expiration`, the status change.
        case expire
    }

    /// One record's content.
    public struct Record: Sendable, Equatable {
        public var action: Action
        public var grantId: String
        public var appUserId: String
        public var entitlement: String
        /// Unix milliseconds; nil for a lifetime grant.
        public var expiresAt: Int64?
        public var reason: String?
        /// When the action happened (Unix milliseconds): the event's time.
        public var at: Int64

        public init(action: Action, grantId: String, appUserId: String, entitlement: String, expiresAt: Int64?, reason: String?, at: Int64) {
            self.action = action
            self.grantId = grantId
            self.appUserId = appUserId
            self.entitlement = entitlement
            self.expiresAt = expiresAt
            self.reason = reason
            self.at = at
        }

        /// The notification id of this action on this grant: a repeat of the record is recognized.
        public var notificationId: String { "\(action.rawValue):\(grantId)" }

        public var json: JSON {
            var members: [String: JSON] = [
                "action": .string(action.rawValue), "grantId": .string(grantId), "appUserId": .string(appUserId),
                "entitlement": .string(entitlement), "at": .integer(at),
            ]
            members["expiresAt"] = expiresAt.map(JSON.integer) ?? .null
            members["reason"] = reason.map(JSON.string) ?? .null
            return .object(members)
        }

        public init?(json: JSON) {
            guard let action = json["action"]?.stringValue.flatMap(Action.init(rawValue:)),
                let grantId = json["grantId"]?.stringValue, !grantId.isEmpty,
                let user = json["appUserId"]?.stringValue, !user.isEmpty,
                let entitlement = json["entitlement"]?.stringValue, !entitlement.isEmpty,
                let at = json["at"]?.int64Value
            else { return nil }
            self.init(
                action: action, grantId: grantId, appUserId: user, entitlement: entitlement, expiresAt: json["expiresAt"]?.int64Value,
                reason: json["reason"]?.stringValue, at: at)
        }
    }
}
