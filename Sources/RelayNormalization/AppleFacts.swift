import RelayCore

/// What the Apple mapping reads from a verified App Store Server Notification V2: the decoded
/// `signedPayload` with its `signedTransactionInfo` and `signedRenewalInfo` decoded in place
/// (RelayVerification). Field names are Apple's (ResponseBodyV2DecodedPayload,
/// JWSTransactionDecodedPayload, JWSRenewalInfoDecodedPayload); dates are Unix milliseconds.
struct AppleNotificationFacts: Decodable {
    var notificationType: String?
    var subtype: String?
    var signedDate: Int64?
    var data: Data?

    struct Data: Decodable {
        var environment: String?
        var bundleId: String?
        var transaction: AppleTransactionFacts?
        var renewal: AppleRenewalFacts?

        enum CodingKeys: String, CodingKey { case environment, bundleId, signedTransactionInfo, signedRenewalInfo }

        init(from decoder: any Decoder) throws {
            let members = try StoreMembers(decoder, keyedBy: CodingKeys.self)
            environment = members.text(.environment)
            bundleId = members.text(.bundleId)
            transaction = members.nested(AppleTransactionFacts.self, .signedTransactionInfo)
            renewal = members.nested(AppleRenewalFacts.self, .signedRenewalInfo)
        }
    }

    enum CodingKeys: String, CodingKey { case notificationType, subtype, signedDate, data }

    /// A payload with none of the members.
    init() {}

    init(from decoder: any Decoder) throws {
        let members = try StoreMembers(decoder, keyedBy: CodingKeys.self)
        notificationType = members.text(.notificationType)
        subtype = members.text(.subtype)
        signedDate = members.integer(.signedDate)
        data = members.nested(Data.self, .data)
    }
}

/// JWSTransactionDecodedPayload: the members events and state use.
struct AppleTransactionFacts: Decodable {
    /// `Auto-Renewable Subscription`, `Non-Consumable`, ...
    var type: String?
    var transactionId: String?
    var originalTransactionId: String?
    var productId: String?
    var bundleId: String?
    var appAccountToken: String?
    var purchaseDate: Int64?
    var expiresDate: Int64?
    var revocationDate: Int64?
    var revocationReason: Int64?
    var inAppOwnershipType: String?
    /// 1 introductory, 2 promotional, 3 offer code, 4 win-back.
    var offerType: Int64?
    var offerDiscountType: String?
    var offerIdentifier: String?
    /// Milliunits of `currency`.
    var price: Int64?
    var currency: String?
    var storefront: String?

    enum CodingKeys: String, CodingKey {
        case type, transactionId, originalTransactionId, productId, bundleId, appAccountToken, purchaseDate, expiresDate, revocationDate
        case revocationReason, inAppOwnershipType, offerType, offerDiscountType, offerIdentifier, price, currency, storefront
    }

    init(from decoder: any Decoder) throws {
        let members = try StoreMembers(decoder, keyedBy: CodingKeys.self)
        type = members.text(.type)
        transactionId = members.text(.transactionId)
        originalTransactionId = members.text(.originalTransactionId)
        productId = members.text(.productId)
        bundleId = members.text(.bundleId)
        appAccountToken = members.text(.appAccountToken)
        purchaseDate = members.integer(.purchaseDate)
        expiresDate = members.integer(.expiresDate)
        revocationDate = members.integer(.revocationDate)
        revocationReason = members.integer(.revocationReason)
        inAppOwnershipType = members.text(.inAppOwnershipType)
        offerType = members.integer(.offerType)
        offerDiscountType = members.text(.offerDiscountType)
        offerIdentifier = members.text(.offerIdentifier)
        price = members.integer(.price)
        currency = members.text(.currency)
        storefront = members.text(.storefront)
    }
}

/// JWSRenewalInfoDecodedPayload: the members events and state use.
struct AppleRenewalFacts: Decodable {
    /// 1 on, 0 off.
    var autoRenewStatus: Int64?
    var autoRenewProductId: String?
    var isInBillingRetryPeriod: Bool?
    var gracePeriodExpiresDate: Int64?

    enum CodingKeys: String, CodingKey { case autoRenewStatus, autoRenewProductId, isInBillingRetryPeriod, gracePeriodExpiresDate }

    init(from decoder: any Decoder) throws {
        let members = try StoreMembers(decoder, keyedBy: CodingKeys.self)
        autoRenewStatus = members.integer(.autoRenewStatus)
        autoRenewProductId = members.text(.autoRenewProductId)
        isInBillingRetryPeriod = members.bool(.isInBillingRetryPeriod)
        gracePeriodExpiresDate = members.integer(.gracePeriodExpiresDate)
    }
}
