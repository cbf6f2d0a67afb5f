/// Where a subscription comes from: a store whose server notifications revenue-relay receives, or the
/// relay's own promotional grants (`POST .../users/{id}/grants`). The raw values are stored (the events
/// store's `store` column, whose rows a notification's lookup finds by case): renaming or removing one needs a
/// migration of what is stored.
public enum Store: String, Sendable, CaseIterable, Hashable, Codable {
    case apple
    case google
    case stripe
    case paddle
    /// Entitlements granted through the backend's grants route: no store sends notifications of them, and
    /// the ingest has no route for them (`notificationStores`).
    case promotional

    /// The stores that send notifications: the ingest's routes, `inspect --store`, `ingest.allowedSources`.
    public static let notificationStores: [Store] = [.apple, .google, .stripe, .paddle]
}
