import Foundation

// The request and response bodies of the App Store Server API endpoints the relay calls, as Apple
// documents them (https://developer.apple.com/documentation/appstoreserverapi). Dates are Unix
// milliseconds, as Apple sends them and as the rest of the relay keeps them. Signed fields (`signed…`)
// are compact JWSs handed on unverified: callers verify them with the App Store chain rules
// (RelayVerification's Apple verifier). Enumerations Apple may extend are kept as their raw values,
// with a typed accessor, so a new value never fails a whole page.

/// Which App Store server answers: production, or the sandbox of TestFlight and development builds.
/// A transaction exists in one of them only.
public enum AppStoreServerEnvironment: String, Sendable, CaseIterable {
    case production = "Production"
    case sandbox = "Sandbox"

    /// Apple's base URL for the environment: the domains Apple has recommended since 2026-05-05
    /// (`api.storekit.itunes.apple.com` and its sandbox twin still work).
    public var baseURL: String {
        switch self {
        case .production: "https://api.storekit.apple.com"
        case .sandbox: "https://api.storekit-sandbox.apple.com"
        }
    }
}

// MARK: - Get Transaction History (v2)

/// The optional filters of Get Transaction History. Apple requires the same filters on every page of
/// one walk, so the pager repeats them with each `revision`.
public struct TransactionHistoryQuery: Sendable, Equatable {
    public enum ProductType: String, Sendable, CaseIterable {
        case autoRenewable = "AUTO_RENEWABLE"
        case nonRenewable = "NON_RENEWABLE"
        case consumable = "CONSUMABLE"
        case nonConsumable = "NON_CONSUMABLE"
    }

    /// Records are ordered by when they were last modified.
    public enum Sort: String, Sendable {
        case ascending = "ASCENDING"
        case descending = "DESCENDING"
    }

    public enum OwnershipType: String, Sendable {
        case familyShared = "FAMILY_SHARED"
        case purchased = "PURCHASED"
    }

    /// Only transactions purchased at or after this time (Unix ms).
    public var startDate: Int64?
    /// Only transactions purchased before this time (Unix ms).
    public var endDate: Int64?
    public var productIds: [String]
    public var productTypes: [ProductType]
    /// Apple's default is ascending: oldest change first.
    public var sort: Sort?
    public var subscriptionGroupIdentifiers: [String]
    public var inAppOwnershipType: OwnershipType?
    /// true: only revoked transactions; false: only not revoked; nil: both.
    public var revoked: Bool?

    public init(
        startDate: Int64? = nil, endDate: Int64? = nil, productIds: [String] = [], productTypes: [ProductType] = [], sort: Sort? = nil,
        subscriptionGroupIdentifiers: [String] = [], inAppOwnershipType: OwnershipType? = nil, revoked: Bool? = nil
    ) {
        self.startDate = startDate
        self.endDate = endDate
        self.productIds = productIds
        self.productTypes = productTypes
        self.sort = sort
        self.subscriptionGroupIdentifiers = subscriptionGroupIdentifiers
        self.inAppOwnershipType = inAppOwnershipType
        self.revoked = revoked
    }

    /// The query parameters, repeated names for lists, in a fixed order.
    var parameters: [(String, String)] {
        var items: [(String, String)] = []
        if let startDate { items.append(("startDate", String(startDate))) }
        if let endDate { items.append(("endDate", String(endDate))) }
        items += productIds.map { ("productId", $0) }
        items += productTypes.map { ("productType", $0.rawValue) }
        if let sort { items.append(("sort", sort.rawValue)) }
        items += subscriptionGroupIdentifiers.map { ("subscriptionGroupIdentifier", $0) }
        if let inAppOwnershipType { items.append(("inAppOwnershipType", inAppOwnershipType.rawValue)) }
        if let revoked { items.append(("revoked", String(revoked))) }
        return items
    }
}

/// One page of Get Transaction History (`HistoryResponse`): up to 20 signed transactions.
public struct TransactionHistoryPage: Codable, Sendable, Equatable {
    /// The token of the next page. Worth storing: a walk resumes from it, and the last page's
    /// revision later returns only what changed since.
    public var revision: String
    public var hasMore: Bool
    public var bundleId: String?
    public var appAppleId: Int64?
    /// `Production` or `Sandbox`.
    public var environment: String?
    /// `JWSTransaction`s, not verified here.
    public var signedTransactions: [String]

    public init(
        revision: String, hasMore: Bool, bundleId: String? = nil, appAppleId: Int64? = nil, environment: String? = nil, signedTransactions: [String]
    ) {
        self.revision = revision
        self.hasMore = hasMore
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environment = environment
        self.signedTransactions = signedTransactions
    }

    enum CodingKeys: String, CodingKey {
        case revision, hasMore, bundleId, appAppleId, environment, signedTransactions
    }

    /// Apple marks every field optional: an absent list is empty, an absent `hasMore` is the last page.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        revision = try container.decodeIfPresent(String.self, forKey: .revision) ?? ""
        hasMore = try container.decodeIfPresent(Bool.self, forKey: .hasMore) ?? false
        bundleId = try container.decodeIfPresent(String.self, forKey: .bundleId)
        appAppleId = try container.decodeIfPresent(Int64.self, forKey: .appAppleId)
        environment = try container.decodeIfPresent(String.self, forKey: .environment)
        signedTransactions = try container.decodeIfPresent([String].self, forKey: .signedTransactions) ?? []
    }
}

// MARK: - Get Notification History

/// The body of Get Notification History. Apple keeps 180 days of history in production and 30 in
/// the sandbox, and takes either `notificationType` or `transactionId`, not both.
public struct NotificationHistoryRequest: Codable, Sendable, Equatable {
    /// Unix ms; inclusive.
    public var startDate: Int64
    /// Unix ms; after `startDate`. A future date means now.
    public var endDate: Int64
    /// A `notificationType` such as `REFUND`, to get only those.
    public var notificationType: String?
    /// A `subtype`; needs its `notificationType`.
    public var notificationSubtype: String?
    /// Any transaction id of one customer, to get only their notifications.
    public var transactionId: String?
    /// true: only notifications that have not reached the relay (or are being retried).
    public var onlyFailures: Bool?

    public init(
        startDate: Int64, endDate: Int64, notificationType: String? = nil, notificationSubtype: String? = nil, transactionId: String? = nil,
        onlyFailures: Bool? = nil
    ) {
        self.startDate = startDate
        self.endDate = endDate
        self.notificationType = notificationType
        self.notificationSubtype = notificationSubtype
        self.transactionId = transactionId
        self.onlyFailures = onlyFailures
    }
}

/// One page of Get Notification History (`NotificationHistoryResponse`).
public struct NotificationHistoryPage: Codable, Sendable, Equatable {
    /// The token of the next page; present while `hasMore`.
    public var paginationToken: String?
    public var hasMore: Bool
    public var notificationHistory: [NotificationHistoryItem]

    public init(paginationToken: String? = nil, hasMore: Bool, notificationHistory: [NotificationHistoryItem]) {
        self.paginationToken = paginationToken
        self.hasMore = hasMore
        self.notificationHistory = notificationHistory
    }

    enum CodingKeys: String, CodingKey {
        case paginationToken, hasMore, notificationHistory
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        paginationToken = try container.decodeIfPresent(String.self, forKey: .paginationToken)
        hasMore = try container.decodeIfPresent(Bool.self, forKey: .hasMore) ?? false
        notificationHistory = try container.decodeIfPresent([NotificationHistoryItem].self, forKey: .notificationHistory) ?? []
    }
}

/// A notification Apple sent (or tried to), with its delivery attempts.
public struct NotificationHistoryItem: Codable, Sendable, Equatable {
    /// The notification's `signedPayload`, exactly as Apple posts it to the relay's route.
    public var signedPayload: String
    public var sendAttempts: [SendAttempt]

    public init(signedPayload: String, sendAttempts: [SendAttempt] = []) {
        self.signedPayload = signedPayload
        self.sendAttempts = sendAttempts
    }

    enum CodingKeys: String, CodingKey {
        case signedPayload, sendAttempts
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        signedPayload = try container.decode(String.self, forKey: .signedPayload)
        sendAttempts = try container.decodeIfPresent([SendAttempt].self, forKey: .sendAttempts) ?? []
    }
}

/// One delivery attempt of a notification.
public struct SendAttempt: Codable, Sendable, Equatable {
    /// Unix ms.
    public var attemptDate: Int64?
    /// `SUCCESS`, `TIMED_OUT`, `UNSUCCESSFUL_HTTP_RESPONSE_CODE`, … (Apple's `sendAttemptResult`).
    public var sendAttemptResult: String?

    public init(attemptDate: Int64? = nil, sendAttemptResult: String? = nil) {
        self.attemptDate = attemptDate
        self.sendAttemptResult = sendAttemptResult
    }
}

// MARK: - Get All Subscription Statuses

/// An auto-renewable subscription's status (Apple's `status`).
public enum SubscriptionStatus: Int, Sendable, CaseIterable {
    case active = 1
    case expired = 2
    case billingRetry = 3
    case billingGracePeriod = 4
    case revoked = 5
}

/// Get All Subscription Statuses (`StatusResponse`): the latest transaction of each of the customer's
/// subscriptions, by subscription group.
public struct SubscriptionStatusesResponse: Codable, Sendable, Equatable {
    public var environment: String?
    public var bundleId: String?
    public var appAppleId: Int64?
    public var data: [SubscriptionGroupStatuses]

    public init(environment: String? = nil, bundleId: String? = nil, appAppleId: Int64? = nil, data: [SubscriptionGroupStatuses]) {
        self.environment = environment
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.data = data
    }

    enum CodingKeys: String, CodingKey {
        case environment, bundleId, appAppleId, data
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        environment = try container.decodeIfPresent(String.self, forKey: .environment)
        bundleId = try container.decodeIfPresent(String.self, forKey: .bundleId)
        appAppleId = try container.decodeIfPresent(Int64.self, forKey: .appAppleId)
        data = try container.decodeIfPresent([SubscriptionGroupStatuses].self, forKey: .data) ?? []
    }
}

/// One subscription group's subscriptions (`SubscriptionGroupIdentifierItem`).
public struct SubscriptionGroupStatuses: Codable, Sendable, Equatable {
    public var subscriptionGroupIdentifier: String
    public var lastTransactions: [LastTransaction]

    public init(subscriptionGroupIdentifier: String, lastTransactions: [LastTransaction]) {
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.lastTransactions = lastTransactions
    }

    enum CodingKeys: String, CodingKey {
        case subscriptionGroupIdentifier, lastTransactions
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        subscriptionGroupIdentifier = try container.decodeIfPresent(String.self, forKey: .subscriptionGroupIdentifier) ?? ""
        lastTransactions = try container.decodeIfPresent([LastTransaction].self, forKey: .lastTransactions) ?? []
    }
}

/// A subscription's latest transaction and renewal info (`LastTransactionsItem`).
public struct LastTransaction: Codable, Sendable, Equatable {
    public var originalTransactionId: String
    /// Apple's raw `status`, 1 to 5 today; see `subscriptionStatus`.
    public var status: Int
    /// `JWSTransaction`, not verified here.
    public var signedTransactionInfo: String
    /// `JWSRenewalInfo`, not verified here.
    public var signedRenewalInfo: String?

    public init(originalTransactionId: String, status: Int, signedTransactionInfo: String, signedRenewalInfo: String? = nil) {
        self.originalTransactionId = originalTransactionId
        self.status = status
        self.signedTransactionInfo = signedTransactionInfo
        self.signedRenewalInfo = signedRenewalInfo
    }

    /// `status` as a known value; nil for one Apple added after this code.
    public var subscriptionStatus: SubscriptionStatus? { SubscriptionStatus(rawValue: status) }
}

// MARK: - Send Consumption Information

/// The body of Send Consumption Information (`PUT /inApps/v2/transactions/consumption/{id}`), Apple's
/// answer format for a `CONSUMPTION_REQUEST` since API 1.19 (2025-12-10), for every product type.
public struct ConsumptionRequest: Codable, Sendable, Equatable {
    public enum DeliveryStatus: String, Codable, Sendable, CaseIterable {
        case delivered = "DELIVERED"
        case undeliveredQualityIssue = "UNDELIVERED_QUALITY_ISSUE"
        case undeliveredWrongItem = "UNDELIVERED_WRONG_ITEM"
        case undeliveredServerOutage = "UNDELIVERED_SERVER_OUTAGE"
        case undeliveredOther = "UNDELIVERED_OTHER"
    }

    public enum RefundPreference: String, Codable, Sendable, CaseIterable {
        case decline = "DECLINE"
        case grantFull = "GRANT_FULL"
        case grantProrated = "GRANT_PRORATED"
    }

    /// Apple refuses anything but true: send consumption data only with the customer's consent.
    public var customerConsented: Bool
    public var deliveryStatus: DeliveryStatus
    public var sampleContentProvided: Bool
    /// Share consumed, in milliunits (0 to 100000 = 100 %); not for auto-renewable subscriptions,
    /// required above 0 with `.grantProrated`.
    public var consumptionPercentage: Int?
    public var refundPreference: RefundPreference?

    public init(
        customerConsented: Bool, deliveryStatus: DeliveryStatus, sampleContentProvided: Bool, consumptionPercentage: Int? = nil,
        refundPreference: RefundPreference? = nil
    ) {
        self.customerConsented = customerConsented
        self.deliveryStatus = deliveryStatus
        self.sampleContentProvided = sampleContentProvided
        self.consumptionPercentage = consumptionPercentage
        self.refundPreference = refundPreference
    }
}

/// Apple's error body (`{"errorCode": 4040010, "errorMessage": "Transaction id not found."}`).
struct AppStoreErrorBody: Decodable {
    var errorCode: Int64?
    var errorMessage: String?
}
