import RelayHTTPClient

extension PlayAPIError {
    /// A request that got no HTTP answer: a malformed URL is the configuration's fault, anything else
    /// (refused, timed out, reset) may pass. libcurl's messages never contain the request's headers.
    static func transport(_ error: HTTPClientError, endpoint: String, setting: String) -> PlayAPIError {
        switch error.kind {
        case .invalidRequest:
            PlayAPIError(kind: .configuration, message: "\(endpoint) cannot be requested (\(error.message)); check \(setting)")
        case .setup, .connect, .timeout, .transfer, .addressRefused, .aborted:
            PlayAPIError(kind: .unavailable, message: "\(endpoint) could not be reached (\(error))")
        }
    }

    /// Text from Google quoted in a message: at most 200 characters, without control characters.
    static func excerpt(_ text: String) -> String {
        let cleaned = String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }))
        return cleaned.count > 200 ? cleaned.prefix(200) + "…" : cleaned
    }
}
