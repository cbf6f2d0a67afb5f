internal import CCurl

/// Collects one response from libcurl's write and header callbacks for `HTTPTransferEngine` (which
/// `HTTPClient` is a facade over). Used by one thread at a time: the engine's.
final class ResponseCollector {
    var body: [UInt8] = []
    var headers: [(name: String, value: String)] = []
    /// Body bytes kept; the rest is read and discarded.
    let maxBody: Int
    /// Lower-case UTF-8 names of the headers to keep; nil keeps all (at most 100).
    let keptHeaders: [[UInt8]]?

    init(maxBody: Int = .max, keptHeaders: [[UInt8]]? = nil) {
        self.maxBody = maxBody
        self.keptHeaders = keptHeaders
    }

    /// Sets the write and header callbacks of `handle` to fill this collector; it must outlive the transfer.
    func attach(to handle: UnsafeMutableRawPointer) -> [CURLcode] {
        let context = Unmanaged.passUnretained(self).toOpaque()
        return [
            relay_curl_setopt_write_function(handle, collectorWriteBody),
            relay_curl_setopt_pointer(handle, CURLOPT_WRITEDATA, context),
            relay_curl_setopt_header_function(handle, collectorWriteHeader),
            relay_curl_setopt_pointer(handle, CURLOPT_HEADERDATA, context),
        ]
    }

    /// One raw header line from libcurl (this runs for every line of every response).
    func addHeaderLine(_ line: UnsafeRawBufferPointer) {
        switch ResponseHeaderLine(line, keeping: keptHeaders) {
        case .statusLine: headers = []  // a new response (after 100 Continue) starts over
        case .header(let name, let value) where headers.count < 100: headers.append((name, value))
        case .header, .other: break
        }
    }

    /// Whether body bytes beyond `maxBody` arrived (and were discarded).
    var truncated = false

    func addBody(_ bytes: UnsafeRawBufferPointer) {
        let room = maxBody - body.count
        if room > 0 { body.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes.prefix(room))) }
        if bytes.count > room { truncated = true }
    }
}

private func collectorWriteBody(_ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ context: UnsafeMutableRawPointer?) -> Int {
    guard let data, let context else { return 0 }
    Unmanaged<ResponseCollector>.fromOpaque(context).takeUnretainedValue().addBody(UnsafeRawBufferPointer(start: data, count: size * count))
    return size * count
}

private func collectorWriteHeader(_ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ context: UnsafeMutableRawPointer?) -> Int {
    guard let data, let context else { return 0 }
    Unmanaged<ResponseCollector>.fromOpaque(context).takeUnretainedValue().addHeaderLine(UnsafeRawBufferPointer(start: data, count: size * count))
    return size * count
}
