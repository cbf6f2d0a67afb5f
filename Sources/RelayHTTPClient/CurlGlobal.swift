internal import CCurl

/// libcurl's global state: initialised once, before any handle (curl_global_init is not thread-safe).
enum CurlGlobal {
    static let initialised: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK
}
