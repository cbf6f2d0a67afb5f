/// Why a backend call failed. `isRetriable` says whether trying again later can help.
public struct BackendError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// The backend has no such artifact (an application's product mapping).
        case notFound = "not_found"
        /// The API key was refused: fix `backend.apiKey`.
        case unauthorized
        /// The backend refused the request as malformed: a bug or a contract mismatch.
        case badRequest = "bad_request"
        /// The backend answered something the contract does not allow.
        case invalidResponse = "invalid_response"
        /// Unreachable, timed out, 5xx or 429 after the retries.
        case unavailable
    }

    public var kind: Kind
    public var message: String
    /// How long the backend asked the client to wait (`Retry-After`), when it did.
    public var retryAfter: Duration?

    public init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
    }
    public var isRetriable: Bool { kind == .unavailable }
    public var description: String { "backend \(kind.rawValue): \(message)" }
}

/// What a conditional write of a subscription state did.
public enum StateWriteResult: Sendable, Equatable {
    case written(SubscriptionState)
    /// 412: someone else wrote first; read again and re-apply.
    case versionMismatch
    /// 409: the stored state is from a newer notification.
    case stale(current: SubscriptionState)
}

/// Where the normalizer reads and writes subscription state: the backend (the worker), or nothing at
/// all (`inspect`: no prior state, products from the configuration).
public protocol SubscriptionStateStore: Sendable {
    func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping
    func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState?
    func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult
    /// The app user `id` stands for in an application: the user an app linked it to (`aliases`), else
    /// itself, with that user's other ids and attributes.
    func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser
    /// `appUser(id)`, and that id's user's other subscriptions that give access now, without the one named
    /// (their entitlements add to the user's status): in one read where the store can.
    func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
        async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
    /// `subscription(store:originalTransactionId:)`, and where the store can read them in the same read, what
    /// `appUserAndOtherActiveSubscriptions` answers for the user the notification likely concerns: `likelyUser`,
    /// else the stored state's first entitled user (anonymous ids never). nil `user`: not read ahead.
    func subscriptionReadingAhead(store: Store, originalTransactionId: String, likelyUser: String?, applicationId: Int)
        async throws(BackendError) -> (state: SubscriptionState?, user: UserReadAhead?)
}

/// A user's `appUserAndOtherActiveSubscriptions`, read with the subscription's state (`subscriptionReadingAhead`).
public struct UserReadAhead: Sendable {
    /// The id it was read for.
    public var id: String
    public var user: AppUser
    /// That user's other subscriptions that give access, without the one read.
    public var active: [SubscriptionState]

    public init(id: String, user: AppUser, active: [SubscriptionState]) {
        self.id = id
        self.user = user
        self.active = active
    }
}

extension SubscriptionStateStore {
    /// A store that knows no linked ids or attributes: every id is its own user.
    public func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser { AppUser(appUserId: id) }

    /// The state alone: nothing read ahead.
    public func subscriptionReadingAhead(store: Store, originalTransactionId: String, likelyUser: String?, applicationId: Int)
        async throws(BackendError) -> (state: SubscriptionState?, user: UserReadAhead?)
    {
        (try await subscription(store: store, originalTransactionId: originalTransactionId), nil)
    }
}

/// An app user as the backend knows them: the id, the other ids an app linked to it, its attributes.
public struct AppUser: Sendable, Equatable {
    public var appUserId: String
    public var aliases: [String]
    /// `name` → a string, number or bool (`PUT .../users/{id}/attributes`).
    public var attributes: [String: JSON]

    public init(appUserId: String, aliases: [String] = [], attributes: [String: JSON] = [:]) {
        self.appUserId = appUserId
        self.aliases = aliases
        self.attributes = attributes
    }

    /// The longest id the backend's routes that store a user take, in bytes.
    public static let maximumIdBytes = 256

    /// Whether the backend's routes that store a user (aliases, attributes, purchases) take `id`: 1 to
    /// `maximumIdBytes` bytes without a control character.
    public static func isStorableId(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= maximumIdBytes && !hasControlCharacters(id)
    }

    /// Whether `id` has a control character (U+0000–U+001F, U+007F–U+009F). The backend's routes refuse such an
    /// id (GRDB binds text up to its first NUL, so `a\u{0}b` would name the user `a`), so the worker never asks
    /// for one: a store's id that has one is a user of its own, with no other ids, attributes or subscriptions.
    /// (Unicode's Cc category exactly, read from the UTF-8 bytes: it runs for every notification's user.)
    public static func hasControlCharacters(_ id: String) -> Bool {
        var afterC2 = false
        for byte in id.utf8 {
            // U+0080–U+009F are 0xC2 0x80–0x9F; 0xC2 is only ever a lead byte.
            if byte < 0x20 || byte == 0x7F || (afterC2 && byte <= 0x9F) { return true }
            afterC2 = byte == 0xC2
        }
        return false
    }

    /// `{"appUserId", "aliases", "attributes"}`: the users route's answer.
    public var json: JSON {
        ["appUserId": .string(appUserId), "aliases": .array(aliases.map(JSON.string)), "attributes": .object(attributes)]
    }

    public init?(json: JSON) {
        guard let id = json["appUserId"]?.stringValue, !id.isEmpty else { return nil }
        self.init(
            appUserId: id, aliases: json["aliases"]?.arrayValue?.compactMap(\.stringValue) ?? [], attributes: json["attributes"]?.objectValue ?? [:])
    }
}

