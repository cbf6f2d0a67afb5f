import Foundation
import RelayCore

/// The `apps` list: each app, its stores and its products.
extension ConfigParser {
    static func app(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.App {
        let map = try node.mapping(
            known: ["key", "projectId", "applicationId", "publicApiKeys", "transferPolicy", "apple", "google", "stripe", "paddle", "products", "web"])
        let key = try map.required("key") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
        guard key.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
            throw ConfigurationError(key: "\(node.path).key", message: "use letters, digits, - and _ only (it is part of the ingest URL)")
        }
        var app = RelayConfiguration.App(
            key: key,
            projectId: try map.required("projectId") { (node) throws(ConfigurationError) in try node.int(in: 0...Int.max) },
            applicationId: try map.required("applicationId") { (node) throws(ConfigurationError) in try node.int(in: 0...Int.max) },
            apple: try map.optional("apple", apple),
            google: try map.optional("google", google),
            stripe: try map.optional("stripe", stripe),
            paddle: try map.optional("paddle", paddle),
            products: try map.optional("products") { (node) throws(ConfigurationError) in try list(node, product) } ?? [],
            publicApiKeys: try map.optional("publicApiKeys") { (node) throws(ConfigurationError) in try keyList(node) } ?? []
        )
        if let policy = try map.optional("transferPolicy", { (node) throws(ConfigurationError) -> RelayConfiguration.TransferPolicy in
            let text = try node.string()
            guard let policy = RelayConfiguration.TransferPolicy(rawValue: text) else { throw node.error("expected transfer or keep") }
            return policy
        }) { app.transferPolicy = policy }
        app.web = try map.optional("web", web)
        if app.web != nil, app.stripe?.api == nil {
            throw ConfigurationError(key: "\(node.path).web", message: "web checkout creates Stripe Checkout Sessions: configure stripe.api (a secret key) too")
        }
        return app
    }

    /// `apps[].web`: web checkout and redemption codes (docs/web-checkout.md).
    static func web(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Web {
        let map = try node.mapping(known: ["successUrl", "cancelUrl", "returnUrl", "redemptionUrl", "codeTTL", "contextKeys", "stripePublishableKey"])
        func url(_ key: String) throws(ConfigurationError) -> String? {
            try map.optional(key) { (node) throws(ConfigurationError) -> String in
                let text = try node.nonEmptyString()
                guard let scheme = text.split(separator: ":", maxSplits: 1).first, scheme.count >= 2, text.contains(":") else {
                    throw node.error("expected a URL (https://…, or an app's own scheme for redemptionUrl)")
                }
                return text
            }
        }
        guard let redemption = try url("redemptionUrl"), redemption.contains("{code}") else {
            throw ConfigurationError(key: "\(node.path).redemptionUrl", message: "required, with {code} where the code goes (myapp://redeem?code={code})")
        }
        let keys = try map.required("contextKeys") { (node) throws(ConfigurationError) -> [RelayConfiguration.Web.ContextKey] in
            try list(node) { (node) throws(ConfigurationError) -> RelayConfiguration.Web.ContextKey in
                let map = try node.mapping(known: ["id", "key"])
                let id = try map.required("id") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
                guard id.count <= 32, id.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
                    throw ConfigurationError(key: "\(node.path).id", message: "letters, digits, - and _, at most 32")
                }
                let key = try map.required("key") { (node) throws(ConfigurationError) -> [UInt8] in
                    guard let bytes = Base64.decode(try node.nonEmptyString()), bytes.count == 32 else {
                        throw node.error("expected 32 random bytes in base64 (openssl rand -base64 32)")
                    }
                    return bytes
                }
                return RelayConfiguration.Web.ContextKey(id: id, key: key)
            }
        }
        guard !keys.isEmpty else { throw ConfigurationError(key: "\(node.path).contextKeys", message: "at least one key; the first seals") }
        guard Set(keys.map(\.id)).count == keys.count else { throw ConfigurationError(key: "\(node.path).contextKeys", message: "key ids must differ") }
        guard let success = try url("successUrl") else {
            throw ConfigurationError(key: "\(node.path).successUrl", message: "required: where Stripe sends the buyer after paying")
        }
        var web = RelayConfiguration.Web(successUrl: success, redemptionUrl: redemption, contextKeys: keys)
        web.cancelUrl = try url("cancelUrl")
        web.returnUrl = try url("returnUrl")
        web.stripePublishableKey = try map.optional("stripePublishableKey") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
        if let ttl = try map.optional("codeTTL", positive) { web.codeTTL = ttl }
        return web
    }

    static let appleEnvironments = ["Sandbox", "Production", "Xcode", "LocalTesting"]

    static func apple(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Apple {
        let map = try node.mapping(known: [
            "bundleId", "appAppleId", "environments", "rootCertificates", "serverApi", "consumption", "grandfathering", "verifyNestedSignatures",
        ])
        let environments = try map.optional("environments") { (node) throws(ConfigurationError) in try node.stringList() } ?? ["Production"]
        for (index, environment) in environments.enumerated() where !appleEnvironments.contains(environment) {
            throw ConfigurationError(key: "\(node.path).environments[\(index)]", message: "expected one of \(appleEnvironments.joined(separator: ", "))")
        }
        let appAppleId = try map.optional("appAppleId") { (node) throws(ConfigurationError) in Int64(try node.int(in: 1...Int.max)) }
        if environments.contains("Production") && appAppleId == nil {
            throw ConfigurationError(key: "\(node.path).appAppleId", message: "is required when environments include Production")
        }
        let roots = try map.optional("rootCertificates") { (node) throws(ConfigurationError) in
            try list(node) { (node) throws(ConfigurationError) in try node.path(mustExist: true) }
        } ?? []
        if environments.contains(where: { $0 == "Sandbox" || $0 == "Production" }) && roots.isEmpty {
            throw ConfigurationError(key: "\(node.path).rootCertificates", message: "at least one root certificate is required to verify signed notifications")
        }
        let serverApi = try map.optional("serverApi") { (node) throws(ConfigurationError) -> RelayConfiguration.AppStoreServerAPI in
            let map = try node.mapping(known: ["keyId", "issuerId", "privateKey", "environment", "baseUrl"])
            let environment = try map.optional("environment") { (node) throws(ConfigurationError) -> String in
                let text = try node.nonEmptyString()
                guard text == "Production" || text == "Sandbox" else { throw node.error("expected Production or Sandbox") }
                return text
            } ?? "Production"
            return RelayConfiguration.AppStoreServerAPI(
                keyId: try map.required("keyId") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
                issuerId: try map.required("issuerId") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
                privateKey: try map.required("privateKey") { (node) throws(ConfigurationError) in try node.path(mustExist: true) },
                environment: environment, baseUrl: try map.optional("baseUrl", httpURL))
        }
        let consumption = try map.optional("consumption") { (node) throws(ConfigurationError) -> RelayConfiguration.ConsumptionAnswer in
            let map = try node.mapping(known: ["customerConsented", "sampleContentProvided", "refundPreference"])
            let consented = try map.required("customerConsented") { (node) throws(ConfigurationError) in try node.bool() }
            guard consented else {
                throw ConfigurationError(
                    key: "\(node.path).customerConsented",
                    message: "Apple accepts consumption data only with the customer's consent; remove consumption to leave requests unanswered")
            }
            let preference = try map.optional("refundPreference") { (node) throws(ConfigurationError) -> String in
                let text = try node.nonEmptyString()
                guard ["DECLINE", "GRANT_FULL", "GRANT_PRORATED"].contains(text) else { throw node.error("expected DECLINE, GRANT_FULL or GRANT_PRORATED") }
                return text
            }
            return RelayConfiguration.ConsumptionAnswer(
                customerConsented: consented,
                sampleContentProvided: try map.optional("sampleContentProvided") { (node) throws(ConfigurationError) in try node.bool() } ?? false,
                refundPreference: preference)
        }
        if let serverApi, !environments.contains(serverApi.environment) {
            throw ConfigurationError(
                key: "\(node.path).serverApi.environment",
                message: "is \(serverApi.environment) (Production unless set), which environments does not list: every transaction the key"
                    + " reads would be rejected; add it to environments or set serverApi.environment")
        }
        if consumption != nil && serverApi == nil {
            throw ConfigurationError(key: "\(node.path).consumption", message: "answering consumption requests needs serverApi (an App Store Connect key)")
        }
        let grandfathering = try map.optional("grandfathering") { (node) throws(ConfigurationError) in
            try list(node) { (node) throws(ConfigurationError) -> RelayConfiguration.GrandfatheringRule in
                let map = try node.mapping(known: ["entitlements", "originalAppVersionBelow", "purchasedBefore"])
                let entitlements = try map.required("entitlements") { (node) throws(ConfigurationError) in try node.stringList() }
                guard !entitlements.isEmpty else { throw ConfigurationError(key: "\(node.path).entitlements", message: "name at least one entitlement") }
                let version = try map.optional("originalAppVersionBelow") { (node) throws(ConfigurationError) -> String in
                    let text = try node.nonEmptyString()
                    guard text.split(separator: ".", omittingEmptySubsequences: false).allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isNumber) }) else {
                        throw node.error("expected a version of dot-separated numbers, such as 2.0 or 145")
                    }
                    return text
                }
                let before = try map.optional("purchasedBefore") { (node) throws(ConfigurationError) -> Int64 in
                    let text = try node.nonEmptyString()
                    guard let milliseconds = Timestamp.milliseconds(dateOrTime: text) else {
                        throw node.error("expected a date (2025-01-01) or an RFC 3339 time")
                    }
                    return milliseconds
                }
                guard version != nil || before != nil else {
                    throw ConfigurationError(key: node.path, message: "give originalAppVersionBelow, purchasedBefore or both")
                }
                return RelayConfiguration.GrandfatheringRule(entitlements: entitlements, originalAppVersionBelow: version, purchasedBefore: before)
            }
        } ?? []
        return RelayConfiguration.Apple(
            bundleId: try map.required("bundleId") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            appAppleId: appAppleId, environments: environments, rootCertificates: roots, serverApi: serverApi, consumption: consumption,
            grandfathering: grandfathering,
            verifyNestedSignatures: try map.optional("verifyNestedSignatures") { (node) throws(ConfigurationError) in try node.bool() } ?? true)
    }

    static func google(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Google {
        let map = try node.mapping(known: ["packageName", "pushAudience", "pushServiceAccount", "jwks", "playApi"])
        let jwks = try map.required("jwks") { (node) throws(ConfigurationError) -> String in
            let text = try node.nonEmptyString()
            if text.lowercased().hasPrefix("https://") { return text }
            if text.lowercased().hasPrefix("http://") {
                // Plain HTTP only on loopback (a local key server in development and tests).
                let host = URL(string: text)?.host?.lowercased() ?? ""
                guard ["127.0.0.1", "localhost", "::1", "[::1]"].contains(host) else {
                    throw node.error("a JWKS URL must use https:// (http:// only for 127.0.0.1 or localhost)")
                }
                return text
            }
            return try node.path(mustExist: true)
        }
        let playApi = try map.optional("playApi") { (node) throws(ConfigurationError) -> RelayConfiguration.PlayAPI in
            let map = try node.mapping(known: ["baseUrl", "tokenUrl", "serviceAccountKey", "acknowledgePurchases"])
            var api = RelayConfiguration.PlayAPI()
            if let value = try map.optional("baseUrl", httpURL) { api.baseUrl = value }
            if let value = try map.optional("tokenUrl", httpURL) { api.tokenUrl = value }
            api.serviceAccountKey = try map.optional("serviceAccountKey") { (node) throws(ConfigurationError) in try node.path(mustExist: true) }
            if let value = try map.optional("acknowledgePurchases", { (node) throws(ConfigurationError) in try node.bool() }) { api.acknowledgePurchases = value }
            return api
        }
        return RelayConfiguration.Google(
            packageName: try map.required("packageName") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            pushAudience: try map.required("pushAudience") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            pushServiceAccount: try map.required("pushServiceAccount") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            jwks: jwks, playApi: playApi)
    }

    static func secrets(_ node: ConfigNode) throws(ConfigurationError) -> [String] {
        let values = try list(node) { (node) throws(ConfigurationError) in try node.nonEmptyString() }
        guard !values.isEmpty else { throw node.error("at least one secret is required") }
        return values
    }

    static func stripe(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Stripe {
        let map = try node.mapping(known: ["signingSecrets", "tolerance", "api"])
        let api = try map.optional("api") { (node) throws(ConfigurationError) -> RelayConfiguration.StripeAPI in
            let map = try node.mapping(known: ["baseUrl", "secretKey"])
            var api = RelayConfiguration.StripeAPI(
                secretKey: try map.required("secretKey") { (node) throws(ConfigurationError) in try node.nonEmptyString() })
            if let value = try map.optional("baseUrl", httpURL) { api.baseUrl = value }
            return api
        }
        return RelayConfiguration.Stripe(
            signingSecrets: try map.required("signingSecrets", secrets),
            tolerance: try map.optional("tolerance", positive) ?? .seconds(300), api: api)
    }

    static func paddle(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Paddle {
        let map = try node.mapping(known: ["secretKeys", "tolerance", "environment", "api"])
        var paddle = RelayConfiguration.Paddle(
            secretKeys: try map.required("secretKeys", secrets),
            tolerance: try map.optional("tolerance", positive) ?? .seconds(300))
        if let environment = try map.optional("environment", { (node) throws(ConfigurationError) in try node.nonEmptyString() }) {
            guard ["PRODUCTION", "SANDBOX"].contains(environment) else {
                throw ConfigurationError(key: "\(node.path).environment", message: "expected PRODUCTION or SANDBOX")
            }
            paddle.environment = environment
        }
        let sandbox = paddle.environment == "SANDBOX"
        paddle.api = try map.optional("api") { (node) throws(ConfigurationError) -> RelayConfiguration.PaddleAPI in
            let map = try node.mapping(known: ["apiKey", "baseUrl", "notificationSettingId"])
            var api = RelayConfiguration.PaddleAPI(
                apiKey: try map.required("apiKey") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
                baseUrl: sandbox ? RelayConfiguration.PaddleAPI.sandboxURL : RelayConfiguration.PaddleAPI.productionURL)
            if let value = try map.optional("baseUrl", httpURL) { api.baseUrl = value }
            api.notificationSettingId = try map.optional("notificationSettingId") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
            return api
        }
        return paddle
    }

    static let productStores = ["APP_STORE", "PLAY_STORE", "STRIPE", "PADDLE"]

    static func product(_ node: ConfigNode) throws(ConfigurationError) -> RelayConfiguration.Product {
        let map = try node.mapping(known: ["productId", "store", "entitlements"])
        let store = try map.required("store") { (node) throws(ConfigurationError) in try node.nonEmptyString() }
        guard productStores.contains(store) else {
            throw ConfigurationError(key: "\(node.path).store", message: "expected one of \(productStores.joined(separator: ", "))")
        }
        return RelayConfiguration.Product(
            productId: try map.required("productId") { (node) throws(ConfigurationError) in try node.nonEmptyString() },
            store: store,
            entitlements: try map.required("entitlements") { (node) throws(ConfigurationError) in try node.stringList() })
    }

    static let endpointEnvironments = ["PRODUCTION", "SANDBOX"]
}
