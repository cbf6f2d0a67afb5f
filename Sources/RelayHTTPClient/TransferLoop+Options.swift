internal import CCurl
import Foundation

/// The options of the engine's easy handles: those every transfer shares, set once per handle, and those
/// of one transfer (its URL, method, headers, body and time bounds), set each time a handle is reused.
extension TransferLoop {
    /// Sets every option of one transfer; returns why it cannot run.
    func configure(_ handle: UnsafeMutableRawPointer, _ transfer: Transfer) -> HTTPClientError? {
        let request = transfer.request
        // Every header line, NUL-terminated, in one buffer that becomes one allocation for libcurl's
        // list (not two per header), checked byte by byte as it is copied.
        var lines: [UInt8] = []
        lines.reserveCapacity(request.headers.reduce(16) { $0 + $1.name.utf8.count + $1.value.utf8.count + 3 })
        for (name, value) in request.headers {
            var allowed = !name.isEmpty
            for byte in name.utf8 {
                allowed = allowed && byte != 58 && byte != 13 && byte != 10 && byte != 0
                lines.append(byte)
            }
            if value.isEmpty {
                lines.append(59)  // "name;" sends an empty header; "name:" would remove it
            } else {
                lines.append(58)
                lines.append(32)
                for byte in value.utf8 {
                    allowed = allowed && byte != 13 && byte != 10 && byte != 0
                    lines.append(byte)
                }
            }
            lines.append(0)
            guard allowed else {
                return HTTPClientError(kind: .invalidRequest, message: "header \(name) has characters not allowed in HTTP headers")
            }
        }
        // No `Expect: 100-continue` round trip for bodies over 1 KiB.
        lines.append(contentsOf: "Expect:".utf8)
        lines.append(0)
        var count = request.headers.count + 1
        // Given here, libcurl skips formatting them anew for every request (unless the caller set them).
        if !request.headers.contains(where: { Self.isNamed($0.name, "user-agent") }) {
            lines.append(contentsOf: "User-Agent: ".utf8)
            lines.append(contentsOf: configuration.userAgent.utf8)
            lines.append(0)
            count += 1
        }
        if request.method != "GET", !request.headers.contains(where: { Self.isNamed($0.name, "content-length") }) {
            lines.append(contentsOf: "Content-Length: \(request.body.count)".utf8)
            lines.append(0)
            count += 1
        }
        transfer.headerList = lines.withUnsafeBytes { relay_slist_pack($0.baseAddress, $0.count, Int32(count)) }
        guard transfer.headerList != nil else { return HTTPClientError(kind: .setup, message: "out of memory for the request headers") }
        transfer.response = ResponseCollector(maxBody: configuration.maxResponseBytes, keptHeaders: keptHeaders)
        transfer.addressCheck = configuration.addressCheck
        transfer.loop = self
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        // Only what differs between transfers; the rest was set once on the handle (`newHandle`), and
        // a handle is reused without curl_easy_reset, keeping those.
        var codes: [CURLcode] = [
            relay_curl_setopt_string(handle, CURLOPT_URL, request.url),
            // Over TLS, wait for ALPN to tell whether a connection multiplexes (HTTP/2) rather than open
            // more; plain http is HTTP/1.1 here, and waiting would serialise behind a slow response.
            relay_curl_setopt_long(handle, CURLOPT_PIPEWAIT, isHTTPS(request.url) ? 1 : 0),
            relay_curl_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, Int(request.connectTimeout.wholeMilliseconds)),
            relay_curl_setopt_long(handle, CURLOPT_TIMEOUT_MS, Int(max(1, request.timeout.wholeMilliseconds))),
            relay_curl_setopt_slist(handle, CURLOPT_HTTPHEADER, transfer.headerList),
            relay_curl_setopt_pointer(handle, CURLOPT_PRIVATE, context),
        ] + transfer.response.attach(to: handle)
        if request.method == "GET" {
            codes.append(relay_curl_setopt_long(handle, CURLOPT_HTTPGET, 1))
            codes.append(relay_curl_setopt_pointer(handle, CURLOPT_CUSTOMREQUEST, nil))
        } else {
            codes.append(relay_curl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, request.method))
            codes.append(relay_curl_setopt_off_t(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count)))
            // libcurl copies the body: the transfer does not depend on the array's storage.
            codes.append(request.body.withUnsafeBytes { bytes in
                relay_curl_setopt_pointer(
                    handle, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: bytes.baseAddress ?? UnsafeRawPointer(("" as StaticString).utf8Start)))
            })
        }
        codes.append(relay_curl_setopt_pointer(handle, CURLOPT_OPENSOCKETDATA, context))
        if let failed = codes.first(where: { $0 != CURLE_OK }) {
            let kind: HTTPClientError.Kind = failed == CURLE_URL_MALFORMAT || failed == CURLE_UNSUPPORTED_PROTOCOL ? .invalidRequest : .setup
            return HTTPClientError(kind: kind, message: String(cString: curl_easy_strerror(failed)))
        }
        return nil
    }

    /// Whether a header name is `lowercased`, ignoring ASCII case.
    static func isNamed(_ name: String, _ lowercased: StaticString) -> Bool {
        guard name.utf8.count == lowercased.utf8CodeUnitCount else { return false }
        return zip(name.utf8, UnsafeBufferPointer(start: lowercased.utf8Start, count: lowercased.utf8CodeUnitCount)).allSatisfy { $0 | 0x20 == $1 | 0x20 }
    }

    /// A new easy handle with the options every transfer shares.
    func newHandle() -> EasyHandle? {
        guard let easy = EasyHandle() else { return nil }
        let handle = easy.pointer
        var codes: [CURLcode] = [
            relay_curl_setopt_string(handle, CURLOPT_PROTOCOLS_STR, "http,https"),
            relay_curl_setopt_long(handle, CURLOPT_FOLLOWLOCATION, 0),
            relay_curl_setopt_long(handle, CURLOPT_NOSIGNAL, 1),
            relay_curl_setopt_long(handle, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS),
            relay_curl_setopt_long(handle, CURLOPT_SSL_VERIFYPEER, 1),
            relay_curl_setopt_long(handle, CURLOPT_SSL_VERIFYHOST, 2),
            relay_curl_setopt_long(handle, CURLOPT_TCP_NODELAY, 1),
        ]
        if configuration.ignoresEnvironmentProxies { codes.append(relay_curl_setopt_string(handle, CURLOPT_PROXY, "")) }
        // Every socket through them: the address check, close-on-exec, and epoll registrations that
        // end before the socket does.
        codes.append(relay_curl_setopt_opensocket_function(handle, engineOpenSocket))
        codes.append(relay_curl_setopt_closesocket_function(handle, engineCloseSocket, Unmanaged.passUnretained(self).toOpaque()))
        // A handle whose options did not take is freed by its owner here.
        return codes.allSatisfy({ $0 == CURLE_OK }) ? easy : nil
    }

    func isHTTPS(_ url: String) -> Bool {
        var bytes = url.utf8.makeIterator()
        for expected in "https:".utf8 {
            guard let byte = bytes.next(), byte | 0x20 == expected | 0x20 else { return false }
        }
        return true
    }
}
