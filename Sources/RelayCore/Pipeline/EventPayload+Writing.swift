// The events' wire bytes written directly: the same bytes as their `JSON` trees' `serialized()` (members
// sorted by name), without building the trees. A test holds the two to each other.

extension EventPayload {
    /// `json.serialized()`'s bytes, written without building the tree (members in name order).
    public func serialized() -> [UInt8] {
        var writer = JSONMembersWriter(capacity: 1536)
        writer.open()
        writer.member("applicationId", .integer(Int64(applicationId)))
        writer.key("data")
        switch data {
        case .store(let data): data.write(to: &writer)
        case .statusChange(let data): data.write(to: &writer)
        }
        writer.member("object", string: object)
        writer.member("projectId", .integer(Int64(projectId)))
        writer.member("timestamp", .integer(timestamp))
        writer.member("type", string: type.rawValue)
        writer.close()
        return writer.output
    }
}

extension StoreEventData {
    /// `json`'s members, in name order.
    func write(to writer: inout JSONMembersWriter) {
        writer.openEventData(aliases: aliases)
        writer.member("bundleId", optional: bundleId)
        writer.member("cancelReason", optional: cancelReason?.rawValue)
        writer.member("commissionPercentage", .number(commissionPercentage))
        writer.member("countryCode", optional: countryCode)
        writer.member("currencyCode", optional: currencyCode)
        writer.member("entitlements", .array(entitlements.map(\.json)))
        writer.member("environment", string: environment)
        writer.member("exchangeRate", optional: exchangeRate)
        writer.member("expirationAt", optional: expirationAt)
        writer.member("expirationReason", optional: expirationReason?.rawValue)
        writer.member("gracePeriodExpiresAt", optional: gracePeriodExpiresAt)
        writer.member("id", string: id)
        writer.member("isFamilyShare", .bool(isFamilyShare))
        writer.member("isSmallBusiness", .bool(isSmallBusiness))
        writer.member("isTrialConversion", .bool(isTrialConversion))
        writer.member("name", string: name.rawValue)
        writer.member("newProductId", optional: newProductId)
        writer.member("offerCode", optional: offerCode)
        writer.member("originalAppUserId", optional: originalAppUserId)
        writer.member("originalTransactionId", string: originalTransactionId)
        writer.member("periodType", string: periodType.rawValue)
        writer.member("price", optional: price)
        writer.member("priceInPurchasedCurrency", optional: priceInPurchasedCurrency)
        writer.member("proceeds", optional: proceeds)
        writer.member("productId", optional: productId)
        writer.member("purchasedAt", optional: purchasedAt)
        writer.member("sdkEvents", .array(sdkEvents.map(JSON.string)))
        writer.member("sequence", optional: sequence)
        writer.member("source", source.json)
        writer.member("store", string: store)
        writer.member("subscriptionStatus", subscriptionStatus.json)
        writer.member("takehomePercentage", .number(takehomePercentage))
        writer.member("taxPercentage", optional: taxPercentage)
        writer.member("transactionId", optional: transactionId)
        writer.closeEventData(transferredFrom: transferredFrom, ts: ts, userAttributes: userAttributes)
    }
}

extension StatusChangeData {
    /// `json`'s members, in name order.
    func write(to writer: inout JSONMembersWriter) {
        writer.openEventData(aliases: aliases)
        writer.member("appUserId", string: appUserId)
        writer.member("entitlements", .array(entitlements.map(\.json)))
        writer.member("environment", string: environment)
        writer.member("from", from.json)
        writer.member("id", string: id)
        writer.member("name", string: name.rawValue)
        writer.member("originalAppUserId", optional: originalAppUserId)
        writer.member("originalTransactionId", string: originalTransactionId)
        writer.member("productId", optional: productId)
        writer.member("sdkEvents", .array(sdkEvents.map(JSON.string)))
        writer.member("sequence", optional: sequence)
        writer.member("source", source.json)
        writer.member("store", string: store)
        writer.member("subscriptionStatus", subscriptionStatus.json)
        writer.member("to", to.json)
        writer.closeEventData(transferredFrom: transferredFrom, ts: ts, userAttributes: userAttributes)
    }
}

extension JSONMembersWriter {
    /// An event's data up to its first own member: the user's other ids, when it has any (first by name).
    mutating func openEventData(aliases: [String]?) {
        open()
        if let aliases, !aliases.isEmpty { member("aliases", .array(aliases.map(JSON.string))) }
    }

    /// An event's data from after its last own member before `transferredFrom` to its end, as `adding` makes them.
    mutating func closeEventData(transferredFrom: String?, ts: Int64, userAttributes: [String: JSON]?) {
        if let transferredFrom { member("transferredFrom", string: transferredFrom) }
        member("ts", .integer(ts))
        if let userAttributes, !userAttributes.isEmpty { member("userAttributes", .object(userAttributes)) }
        close()
    }
}
