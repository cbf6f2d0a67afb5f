public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The worker's `ConsumptionAnswers` over the App Store Server API client: one per app with
/// `apple.consumption` (which the configuration allows only with `apple.serverApi`).
public struct AppStoreConsumptionSender: ConsumptionAnswers {
    let client: AppStoreServerClient

    /// Short in-call retries: the worker retries the whole record with its own backoff, and a long
    /// wait here would hold the subscription's lane.
    static let retry = AppStoreServerClient.RetryPolicy(delays: [.milliseconds(500)], maximumRetryAfter: .seconds(5))

    public func sendConsumptionInformation(transactionId: String, _ information: ConsumptionInformation) async throws(StoreAPIError) {
        let request = ConsumptionRequest(
            customerConsented: information.customerConsented,
            deliveryStatus: information.deliveryStatus == .delivered ? .delivered : .undeliveredOther,
            sampleContentProvided: information.sampleContentProvided, consumptionPercentage: information.consumptionPercentage,
            refundPreference: information.refundPreference.flatMap(ConsumptionRequest.RefundPreference.init(rawValue:)))
        do {
            try await client.sendConsumptionInformation(transactionId: transactionId, request)
        } catch {
            let kind: StoreAPIError.Kind =
                switch error.kind {
                case .configuration: .configuration
                case .keyRefused, .rejected: .rejected
                case .notFound: .notFound
                case .unavailable: .unavailable
                case .invalidResponse: .invalidResponse
                }
            throw StoreAPIError(.appStore, kind: kind, message: error.message, status: error.status)
        }
    }

    /// The senders of the apps that configure `apple.consumption`, by app key.
    /// - Throws: a configuration error naming the key when the App Store Connect key cannot be used.
    public static func senders(
        for configuration: RelayConfiguration, http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8),
        logger: Logger
    ) throws(ConfigurationError) -> [String: any ConsumptionAnswers] {
        var senders: [String: any ConsumptionAnswers] = [:]
        for (index, app) in configuration.apps.enumerated() {
            guard let apple = app.apple, apple.consumption != nil, let serverApi = apple.serverApi else { continue }
            let key = "apps[\(index)].apple.serverApi"
            guard let environment = AppStoreServerEnvironment(rawValue: serverApi.environment) else {
                throw ConfigurationError(key: "\(key).environment", message: "must be Production or Sandbox")
            }
            do {
                let connectKey = try AppStoreConnectKey.load(
                    path: serverApi.privateKey, keyId: serverApi.keyId, issuerId: serverApi.issuerId, bundleId: apple.bundleId)
                let client = try AppStoreServerClient(
                    key: connectKey, environment: environment, baseURL: serverApi.baseUrl, http: http, retry: retry, logger: logger)
                senders[app.key] = AppStoreConsumptionSender(client: client)
            } catch {
                throw ConfigurationError(key: key, message: error.message)
            }
        }
        return senders
    }
}
