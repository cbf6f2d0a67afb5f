public import RelayCore

extension StoreAPIError {
    /// A store API request that got no HTTP answer: a malformed URL is the configuration's fault
    /// (`setting` names the key to fix), anything else (refused, timed out, reset) may pass. libcurl's
    /// messages never contain the request's headers.
    public static func transport(_ error: HTTPClientError, api: API, endpoint: String, setting: String) -> StoreAPIError {
        switch error.kind {
        case .invalidRequest:
            StoreAPIError(api, kind: .configuration, message: "\(endpoint) cannot be requested (\(error.message)); check \(setting)")
        case .setup, .connect, .timeout, .transfer, .addressRefused, .aborted:
            StoreAPIError(api, kind: .unavailable, message: "\(endpoint) could not be reached (\(error))")
        }
    }
}
