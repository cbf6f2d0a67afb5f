internal import CCurl
import Foundation
import RelayCore

/// An HTTP response.
public struct HTTPClientResponse: Sendable {
    public var status: Int
    /// Header names lower-cased, in arrival order.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Connections this request had to open (0 when it reused a kept-alive one).
    public var newConnections: Int = 0

    public func header(_ name: String) -> String? {
        let lowered = name.lowercased()
        return headers.first { $0.name == lowered }?.value
    }

    public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// Why a request got no HTTP response.
public struct HTTPClientError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        case setup, invalidRequest = "invalid_request", connect, timeout, transfer
        /// The address check refused the address a connection was about to reach (SSRF guard).
        case addressRefused = "address_refused"
        /// The engine was told to abort its transfers (a shutdown past its drain bound): nothing is known
        /// of whether the peer got the request.
        case aborted
    }

    public var kind: Kind
    /// libcurl's explanation; never contains the request body or headers.
    public var message: String
    public var isRetriable: Bool { kind == .connect || kind == .timeout || kind == .transfer }

    public var description: String { "\(kind.rawValue): \(message)" }
}

/// A small HTTP client over libcurl. Transfers run on the client's own OS threads (at most
/// `maxConcurrentTransfers`), never on Swift's cooperative pool and not on a dispatch queue either: on
/// Linux the cooperative pool shares libdispatch's threads, and blocking transfers there starve every
/// task. Each thread keeps one libcurl handle, so connections are reused (keep-alive) across requests;
/// requests beyond the bound wait their turn. Copies share the threads; they end with the last copy.
public struct HTTPClient: Sendable {
    /// Connection timeout. Default: 5 s.
    public var connectTimeout: Duration = .seconds(5)
    /// Whole-request timeout. Default: 30 s.
    public var timeout: Duration = .seconds(30)
    private let pool: TransferPool

    public init(connectTimeout: Duration = .seconds(5), timeout: Duration = .seconds(30), maxConcurrentTransfers: Int = 8) {
        self.connectTimeout = connectTimeout
        self.timeout = timeout
        self.pool = TransferPool(limit: max(1, maxConcurrentTransfers))
    }

    public func send(
        _ method: String, _ url: String, headers: [(String, String)] = [], body: [UInt8]? = nil
    ) async throws(HTTPClientError) -> HTTPClientResponse {
        let result: Result<HTTPClientResponse, HTTPClientError> = await withCheckedContinuation { continuation in
            pool.submit { easy in
                let result = Result { () throws(HTTPClientError) in try perform(easy, method, url, headers: headers, body: body) }
                return { continuation.resume(returning: result) }
            }
        }
        return try result.get()
    }

    private func perform(_ easy: CurlEasy?, _ method: String, _ url: String, headers: [(String, String)], body: [UInt8]?) throws(HTTPClientError) -> HTTPClientResponse {
        guard let easy else { throw HTTPClientError(kind: .setup, message: "libcurl could not create a transfer") }
        let sink = ResponseCollector()
        try easy.set(CURLOPT_URL, url)
        try easy.set(CURLOPT_NOSIGNAL, 1)
        try easy.set(CURLOPT_CUSTOMREQUEST, method)
        try easy.set(CURLOPT_CONNECTTIMEOUT_MS, Int(connectTimeout.wholeMilliseconds))
        try easy.set(CURLOPT_TIMEOUT_MS, Int(timeout.wholeMilliseconds))
        try easy.setHeaders(headers + [("Expect", "")])
        let bodyBytes = body ?? []
        let result = bodyBytes.withUnsafeBytes { bodyPointer in
            Result { () throws(HTTPClientError) -> HTTPClientResponse in try transfer(easy, sink, body: body == nil ? nil : bodyPointer) }
        }
        return try result.get()
    }

    private func transfer(_ easy: CurlEasy, _ sink: ResponseCollector, body: UnsafeRawBufferPointer?) throws(HTTPClientError) -> HTTPClientResponse {
        if let body {
            guard relay_curl_setopt_off_t(easy.handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)) == CURLE_OK else {
                throw HTTPClientError(kind: .setup, message: "could not set the request body size")
            }
            // libcurl reads the body from this pointer during curl_easy_perform only.
            guard relay_curl_setopt_pointer(easy.handle, CURLOPT_POSTFIELDS, UnsafeMutableRawPointer(mutating: body.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!)) == CURLE_OK else {
                throw HTTPClientError(kind: .setup, message: "could not set the request body")
            }
        }
        _ = sink.attach(to: easy.handle)
        let code = curl_easy_perform(easy.handle)
        guard code == CURLE_OK else { throw HTTPClientError(code: code) }
        var status = 0
        _ = relay_curl_getinfo_long(easy.handle, CURLINFO_RESPONSE_CODE, &status)
        var connects = 0
        _ = relay_curl_getinfo_long(easy.handle, CURLINFO_NUM_CONNECTS, &connects)
        return HTTPClientResponse(status: status, headers: sink.headers, body: sink.body, newConnections: connects)
    }
}

/// The client's transfer threads. Each owns one easy handle for its lifetime (keep-alive); threads are
/// started on demand up to `limit` and end when the pool does.
private final class TransferPool: Sendable {
    private let queue: TransferQueue

    init(limit: Int) {
        queue = TransferQueue(limit: limit)
    }

    deinit { queue.close() }

    /// Runs `job` on a transfer thread; the closure it returns runs after the thread is free again,
    /// so a caller that immediately sends again finds it idle and reuses its connection.
    func submit(_ job: @escaping @Sendable (CurlEasy?) -> @Sendable () -> Void) {
        queue.submit(job)
    }
}

private final class TransferQueue: @unchecked Sendable {
    // Guarded by `condition`.
    private let condition = NSCondition()
    private var jobs: [@Sendable (CurlEasy?) -> @Sendable () -> Void] = []
    private var threads = 0
    private var idle = 0
    private var closed = false
    private let limit: Int

    init(limit: Int) {
        self.limit = limit
    }

    func submit(_ job: @escaping @Sendable (CurlEasy?) -> @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        let spawn = idle < jobs.count && threads < limit
        if spawn { threads += 1 }
        condition.signal()
        condition.unlock()
        if spawn {
            startDedicatedThread(named: "http-client") { [self] in run() }
        }
    }

    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }

    private func run() {
        let easy = try? CurlEasy()
        condition.lock()
        while true {
            while jobs.isEmpty && !closed {
                idle += 1
                condition.wait()
                idle -= 1
            }
            if jobs.isEmpty {  // closed and drained
                threads -= 1
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            easy?.reset()
            let finish = job(easy)
            condition.lock()
            // Counted idle before the caller resumes, so its next request comes to this thread.
            idle += 1
            condition.unlock()
            finish()
            condition.lock()
            idle -= 1
        }
    }
}
