internal import CCurl

/// One outgoing request for `HTTPTransferEngine`.
public struct HTTPTransferRequest: Sendable {
    public var url: String
    public var method: String
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Time to establish a connection (TCP and TLS). Default: 5 s.
    public var connectTimeout: Duration
    /// Time for the whole exchange, connecting included.
    public var timeout: Duration

    public init(
        url: String, method: String = "POST", headers: [(name: String, value: String)], body: [UInt8],
        connectTimeout: Duration = .seconds(5), timeout: Duration
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.connectTimeout = connectTimeout
        self.timeout = timeout
    }
}

/// What became of one `HTTPTransferRequest`.
public struct HTTPTransferResult: Sendable {
    /// The response, when one arrived (any status: 3xx are not followed).
    public var response: HTTPClientResponse?
    /// Why there is no response.
    public var error: HTTPClientError?

    public init(response: HTTPClientResponse? = nil, error: HTTPClientError? = nil) {
        self.response = response
        self.error = error
    }
}

/// One transfer's request, response collection and completion. Lives from submit to completion.
final class Transfer: @unchecked Sendable {
    let request: HTTPTransferRequest
    let completion: @Sendable (HTTPTransferResult) -> Void
    // Written only on the engine's thread while the transfer runs.
    var headerList: UnsafeMutablePointer<curl_slist>?
    var response = ResponseCollector()
    var refusal: String?
    var addressCheck: (@Sendable (String) -> String?)?
    /// The loop running it, while it runs (it outlives every transfer).
    unowned var loop: TransferLoop?

    init(request: HTTPTransferRequest, completion: @escaping @Sendable (HTTPTransferResult) -> Void) {
        self.request = request
        self.completion = completion
    }

    func freeHeaders() {
        if let headerList { free(headerList) }  // one block (relay_slist_pack)
        headerList = nil
    }

}

/// One header line of a response, parsed over bytes: no Foundation string work per line.
enum ResponseHeaderLine {
    case statusLine
    /// The name lower-cased, the value trimmed.
    case header(String, String)
    /// A blank line, a line without a colon, or a header not among the kept ones.
    case other

    /// - Parameter kept: lower-case UTF-8 names to keep; nil keeps every header.
    init(_ line: UnsafeRawBufferPointer, keeping kept: [[UInt8]]? = nil) {
        var end = line.count
        while end > 0, line[end - 1] == 10 || line[end - 1] == 13 || line[end - 1] == 32 || line[end - 1] == 9 { end -= 1 }
        guard end > 0 else {
            self = .other
            return
        }
        if end >= 5, line[0] == 72, line[1] == 84, line[2] == 84, line[3] == 80, line[4] == 47 {  // "HTTP/"
            self = .statusLine
            return
        }
        guard let colon = line[..<end].firstIndex(of: 58) else {
            self = .other
            return
        }
        func lowered(_ index: Int) -> UInt8 {
            let byte = line[index]
            return byte >= 65 && byte <= 90 ? byte + 32 : byte
        }
        if let kept, !kept.contains(where: { name in name.count == colon && name.indices.allSatisfy { lowered($0) == name[$0] } }) {
            self = .other
            return
        }
        var valueStart = colon + 1
        while valueStart < end, line[valueStart] == 32 || line[valueStart] == 9 { valueStart += 1 }
        let name = String(unsafeUninitializedCapacity: colon) { buffer in
            for index in 0..<colon { buffer[index] = lowered(index) }
            return colon
        }
        self = .header(name, String(decoding: UnsafeRawBufferPointer(rebasing: line[valueStart..<end]), as: UTF8.self))
    }
}

/// One libcurl easy handle, freed (`curl_easy_cleanup`) when its owner lets go of it. The engine keeps
/// it idle between transfers for reuse; it must be out of the multi handle by then.
final class EasyHandle {
    let pointer: UnsafeMutableRawPointer

    init?() {
        guard let pointer = curl_easy_init() else { return nil }
        self.pointer = pointer
    }

    deinit { curl_easy_cleanup(pointer) }
}
