internal import CCurl
import Foundation

/// libcurl's global state: initialised once, before any handle (curl_global_init is not thread-safe).
enum CurlGlobal {
    static let initialised: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK
}

/// Owns one `CURL *` easy handle and the header list it uses.
final class CurlEasy {
    let handle: UnsafeMutableRawPointer
    private var headerList: UnsafeMutablePointer<curl_slist>?

    init() throws(HTTPClientError) {
        guard CurlGlobal.initialised, let handle = curl_easy_init() else {
            throw HTTPClientError(kind: .setup, message: "libcurl could not create a transfer")
        }
        self.handle = handle
    }

    deinit {
        curl_easy_cleanup(handle)
        if let headerList { curl_slist_free_all(headerList) }
    }

    /// Back to default options for the next transfer; the handle keeps its open connections (keep-alive),
    /// DNS and TLS session caches.
    func reset() {
        curl_easy_reset(handle)
        if let headerList { curl_slist_free_all(headerList) }
        headerList = nil
    }

    func set(_ option: CURLoption, _ value: Int) throws(HTTPClientError) {
        try check(relay_curl_setopt_long(handle, option, value), option)
    }

    func set(_ option: CURLoption, _ value: String) throws(HTTPClientError) {
        // libcurl copies string options (since 7.17), so the temporary C string may go.
        try check(relay_curl_setopt_string(handle, option, value), option)
    }

    func setHeaders(_ headers: [(String, String)]) throws(HTTPClientError) {
        for (name, value) in headers {
            guard !name.contains(where: { $0 == ":" || $0 == "\r" || $0 == "\n" }), !value.contains(where: { $0 == "\r" || $0 == "\n" })
            else { throw HTTPClientError(kind: .invalidRequest, message: "header \(name) has characters not allowed in HTTP headers") }
            // "Name;" sends an empty header; "Name:" with no value would remove it.
            headerList = curl_slist_append(headerList, value.isEmpty ? "\(name);" : "\(name): \(value)")
        }
        try check(relay_curl_setopt_slist(handle, CURLOPT_HTTPHEADER, headerList), CURLOPT_HTTPHEADER)
    }

    private func check(_ code: CURLcode, _ option: CURLoption) throws(HTTPClientError) {
        guard code == CURLE_OK else {
            throw HTTPClientError(kind: .setup, message: "libcurl option \(option.rawValue): \(String(cString: curl_easy_strerror(code)))")
        }
    }
}
