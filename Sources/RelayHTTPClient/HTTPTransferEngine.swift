internal import CCurl
import Foundation
import RelayCore
import Synchronization

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

/// Many concurrent HTTP transfers over one libcurl multi handle, driven by one dedicated OS thread
/// (never Swift's cooperative pool): connections are kept alive and reused across transfers, HTTP/2 is
/// used where a TLS endpoint offers it (and multiplexed), redirects are never followed, only `http` and
/// `https` are spoken, TLS peers are verified, and proxies from the environment are ignored unless the
/// configuration says otherwise.
///
/// An optional address check runs on every new connection, on the address the socket is about to
/// connect to (after DNS, so a name that resolves differently later cannot slip past it); a refused
/// address fails the transfer with kind `.addressRefused`.
///
/// Completions run on the engine's thread: keep them short and never block in them.
public final class HTTPTransferEngine: Sendable {
    public struct Configuration: Sendable {
        /// Connections kept open per host (and concurrent transfers per host beyond which libcurl queues).
        public var maxConnectionsPerHost: Int = 64
        /// Idle connections kept in the cache over all hosts.
        public var maxCachedConnections: Int = 1024
        /// Response bytes kept; the rest of a longer body is read and discarded.
        public var maxResponseBytes: Int = 4096
        /// Refusal reason for an address about to be connected to (textual IPv4 or IPv6), or nil to allow it.
        public var addressCheck: (@Sendable (String) -> String?)?
        /// `User-Agent` of every request.
        public var userAgent: String = "revenue-relay"
        /// Lower-case names of the response headers to keep; nil keeps all (at most 100).
        public var keptResponseHeaders: Set<String>?
        /// Whether `http_proxy`, `https_proxy` and `no_proxy` from the environment are ignored. True for
        /// webhooks (the address check must see the endpoint's own address); API clients use the proxy
        /// an operator set.
        public var ignoresEnvironmentProxies = true

        public init() {}
    }

    private let loop: TransferLoop

    public init(configuration: Configuration = .init()) throws(HTTPClientError) {
        guard CurlGlobal.initialised, let multi = curl_multi_init() else {
            throw HTTPClientError(kind: .setup, message: "libcurl could not create a multi handle")
        }
        _ = relay_curl_multi_setopt_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, max(1, configuration.maxConnectionsPerHost))
        _ = relay_curl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, max(1, configuration.maxCachedConnections))
        _ = relay_curl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        let loop = try TransferLoop(multi: multi, configuration: configuration)
        self.loop = loop
        startDedicatedThread(named: "http-engine") { loop.run() }
    }

    deinit { loop.close() }

    /// How often the engine's thread woke up so far (tests: an idle engine sleeps).
    var wakeUps: Int { loop.wakeUps.load(ordering: .relaxed) }
    /// Sockets registered with epoll, and how many of them are parked (idle connections), when the
    /// thread last went to sleep or when it ended (tests).
    var registeredSockets: (all: Int, parked: Int) {
        let packed = loop.registeredSockets.load(ordering: .relaxed)
        return (packed >> 32, packed & 0xFFFF_FFFF)
    }

    /// Starts a transfer; `completion` runs on the engine's thread once it finished. After `close`,
    /// completes at once with a `.setup` error.
    public func submit(_ request: HTTPTransferRequest, completion: @escaping @Sendable (HTTPTransferResult) -> Void) {
        loop.submit(Transfer(request: request, completion: completion))
    }

    /// Runs one transfer to its end.
    public func send(_ request: HTTPTransferRequest) async -> HTTPTransferResult {
        await withCheckedContinuation { continuation in
            submit(request) { continuation.resume(returning: $0) }
        }
    }

    /// Stops taking transfers, lets the running ones finish (each within its own timeout), then ends
    /// the thread and frees the handles.
    public func close() async {
        loop.close()
        await loop.finished.value()
    }

    /// Ends every running transfer now: each completes with an `.aborted` error (a shutdown that cannot
    /// wait for a slow peer). Transfers submitted later complete the same way at once.
    public func abortRunning() {
        loop.abortRunning()
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
    fileprivate unowned var loop: TransferLoop?

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

/// The engine's thread and everything it owns. The multi handle, the epoll set, the easy-handle pool
/// and the running transfers are touched only on that thread; `submit` and `close` hand over through
/// the mutex and wake the thread through an eventfd.
///
/// Event-driven (`curl_multi_socket_action`): libcurl names the sockets to watch and its next timeout,
/// one `epoll_wait` reports every ready socket, and only the transfers on those sockets run. (The
/// `curl_multi_perform` loop it replaces visited every running transfer on every wake-up.)
private final class TransferLoop: @unchecked Sendable {
    struct Inbox {
        var pending: [Transfer] = []
        var closed = false
        var abort = false
    }

    private let multi: UnsafeMutableRawPointer
    private let epoll: Int32
    private let wakeUp: Int32
    private let configuration: HTTPTransferEngine.Configuration
    private let inbox = Mutex(Inbox())
    let finished = Eventual<Void>()
    let wakeUps = Atomic<Int>(0)
    /// `registrations.count << 32 | parkedCount`, published for tests.
    let registeredSockets = Atomic<Int>(0)
    // Engine thread only.
    private var running: [UnsafeMutableRawPointer: Transfer] = [:]
    private var idleHandles: [UnsafeMutableRawPointer] = []
    /// When libcurl wants `CURL_SOCKET_TIMEOUT` handled (uptime nanoseconds), or nil for no timer.
    fileprivate var timerDeadline: UInt64?

    private let keptHeaders: [[UInt8]]?

    init(multi: UnsafeMutableRawPointer, configuration: HTTPTransferEngine.Configuration) throws(HTTPClientError) {
        let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        let wakeUp = relay_eventfd_open()
        guard epoll >= 0, wakeUp >= 0, relay_eventfd_watch(epoll, wakeUp) == 0 else {
            if epoll >= 0 { Glibc.close(epoll) }
            if wakeUp >= 0 { Glibc.close(wakeUp) }
            curl_multi_cleanup(multi)
            throw HTTPClientError(kind: .setup, message: "could not create the HTTP engine's epoll set: errno \(errno)")
        }
        self.multi = multi
        self.epoll = epoll
        self.wakeUp = wakeUp
        self.configuration = configuration
        self.keptHeaders = configuration.keptResponseHeaders.map { $0.map { Array($0.lowercased().utf8) } }
        let context = Unmanaged.passUnretained(self).toOpaque()
        _ = relay_curl_multi_set_socket_function(multi, engineWatchSocket, context)
        _ = relay_curl_multi_set_timer_function(multi, engineSetTimer, context)
    }

    func submit(_ transfer: Transfer) {
        let (accepted, wake) = inbox.withLock { inbox -> (Bool, Bool) in
            guard !inbox.closed else { return (false, false) }
            inbox.pending.append(transfer)
            // One wake-up per batch: the thread takes everything pending when it wakes.
            return (true, inbox.pending.count == 1)
        }
        guard accepted else {
            transfer.completion(HTTPTransferResult(error: HTTPClientError(kind: .setup, message: "the HTTP engine is closed")))
            return
        }
        if wake { relay_eventfd_signal(wakeUp) }
    }

    func close() {
        inbox.withLock { $0.closed = true }
        relay_eventfd_signal(wakeUp)
    }

    func abortRunning() {
        inbox.withLock { $0.abort = true }
        relay_eventfd_signal(wakeUp)
    }

    func run() {
        let capacity = 256
        var fds = [Int32](repeating: 0, count: capacity)
        var flags = [Int32](repeating: 0, count: capacity)
        var stillRunning: Int32 = 0
        while true {
            let (pending, closed, abort) = inbox.withLock { inbox in
                defer { inbox.pending = [] }
                return (inbox.pending, inbox.closed, inbox.abort)
            }
            if abort {
                // Sticky: a transfer submitted after the abort (a queued delivery released by one that
                // just finished) ends at once too, so nothing outlives the shutdown.
                abortAll()
                for transfer in pending { complete(transfer, Self.abortedResult) }
            } else {
                for transfer in pending { start(transfer) }
            }
            if closed && running.isEmpty { break }

            registeredSockets.store(registrations.count << 32 | parkedCount, ordering: .relaxed)
            let ready = relay_epoll_wait(epoll, &fds, &flags, Int32(capacity), waitMilliseconds())
            wakeUps.add(1, ordering: .relaxed)
            if !deregisteredInBatch.isEmpty { deregisteredInBatch.removeAll(keepingCapacity: true) }
            for index in 0..<Int(max(0, ready)) {
                if fds[index] == wakeUp {
                    relay_eventfd_drain(wakeUp)
                } else if !deregisteredInBatch.isEmpty && deregisteredInBatch.contains(fds[index]) {
                    // Reported for a socket that left the set earlier in this batch; its number may
                    // already belong to a new socket, which epoll reports afresh if it is ready.
                    continue
                } else if let registration = registrations[fds[index]] {
                    if registration.parked {
                        // An idle connection's socket stirred: the peer closed it (or sent what nobody
                        // asked for). It leaves the set; libcurl finds out when it next looks at the
                        // connection, and watches it again if it is still good.
                        deregister(fds[index])
                    } else {
                        _ = curl_multi_socket_action(multi, fds[index], flags[index], &stillRunning)
                    }
                }
            }
            if let deadline = timerDeadline, DispatchTime.now().uptimeNanoseconds >= deadline {
                timerDeadline = nil
                _ = curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &stillRunning)
            }
            collectFinished()
        }
        for handle in idleHandles { curl_easy_cleanup(handle) }
        idleHandles = []
        // Closes the cached connections (each leaving the epoll set first, in `closing`).
        curl_multi_cleanup(multi)
        registeredSockets.store(registrations.count << 32 | parkedCount, ordering: .relaxed)
        Glibc.close(epoll)
        finished.set(())
    }

    /// How long `epoll_wait` may sleep: until libcurl's timer, at most 1 s.
    private func waitMilliseconds() -> Int32 {
        guard let deadline = timerDeadline else { return 1000 }
        let now = DispatchTime.now().uptimeNanoseconds
        guard deadline > now else { return 0 }
        // Rounded up: waking before the deadline would only loop back into a zero-length wait.
        return Int32(min(1000, (deadline - now + 999_999) / 1_000_000))
    }

    // The eventfd goes with the loop, not when the thread ends: `submit` and `close` may still signal
    // it from other threads until the last reference is gone.
    deinit { Glibc.close(wakeUp) }

    /// A socket registered with epoll.
    private struct Registration {
        /// CURL_POLL_IN, OUT or INOUT.
        var interest: Int32
        /// libcurl stopped watching it (its connection idles in the cache), but it stays registered.
        var parked = false
    }

    /// The sockets registered with epoll, by number. Engine thread only.
    private var registrations: [Int32: Registration] = [:]
    /// How many of `registrations` are parked. Engine thread only.
    private var parkedCount = 0
    /// Socket numbers that left the epoll set while the current batch of events is handled: a later
    /// event of the batch with that number is stale (the socket may be closed and its number reused).
    private var deregisteredInBatch: Set<Int32> = []
    /// The sockets opened through `engineOpenSocket` and not yet closed through `engineCloseSocket`.
    /// Only their close is seen here, so only they stay registered while idle. Engine thread only.
    private var ownSockets: Set<Int32> = []

    /// libcurl's socket callback: watch `socket` for `what` (CURL_POLL_IN / OUT / INOUT / REMOVE).
    ///
    /// A kept-alive connection is watched for a response, then REMOVEd when it goes idle, then watched
    /// for the next response when reused: two `epoll_ctl` calls per request. Instead an own socket
    /// waiting for input stays registered while idle (parked): reuse costs nothing, and the one that
    /// stirs while idle leaves the set then (see `run`). `closing` takes any registration away before
    /// the socket is closed, so none outlives it, even when a child process inherited a copy. Other
    /// sockets (libcurl's own, such as a resolver's) leave the set on REMOVE, while still open.
    fileprivate func watch(_ socket: curl_socket_t, _ what: Int32) {
        let current = registrations[socket]
        if what == CURL_POLL_REMOVE {
            guard let current else { return }
            if current.interest == CURL_POLL_IN, ownSockets.contains(socket) {
                if !current.parked {
                    registrations[socket]?.parked = true
                    parkedCount += 1
                }
            } else {
                deregister(socket)
            }
            return
        }
        if let current, current.interest == what {
            if current.parked {
                registrations[socket]?.parked = false
                parkedCount -= 1
            }
            return
        }
        if relay_epoll_watch(epoll, socket, what, current == nil ? 1 : 0) == 0 {
            if current?.parked == true { parkedCount -= 1 }
            registrations[socket] = Registration(interest: what)
        } else if current != nil {
            deregister(socket)
        }
    }

    /// Takes `socket` out of the epoll set and out of `registrations`.
    private func deregister(_ socket: curl_socket_t) {
        if registrations.removeValue(forKey: socket)?.parked == true { parkedCount -= 1 }
        deregisteredInBatch.insert(socket)
        _ = relay_epoll_watch(epoll, socket, CURL_POLL_REMOVE, 0)
    }

    /// A socket `engineOpenSocket` opened.
    fileprivate func opened(_ socket: curl_socket_t) {
        ownSockets.insert(socket)
    }

    /// libcurl is about to close an own socket: it leaves the epoll set first.
    fileprivate func closing(_ socket: curl_socket_t) {
        ownSockets.remove(socket)
        if registrations[socket] != nil { deregister(socket) }
    }

    private func start(_ transfer: Transfer) {
        guard let handle = idleHandles.popLast() ?? newHandle() else {
            complete(transfer, HTTPTransferResult(error: HTTPClientError(kind: .setup, message: "libcurl could not create a transfer")))
            return
        }
        if let failure = configure(handle, transfer) {
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, HTTPTransferResult(error: failure))
            return
        }
        running[handle] = transfer
        let added = curl_multi_add_handle(multi, handle)
        if added != CURLM_OK {
            running[handle] = nil
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, HTTPTransferResult(error: HTTPClientError(kind: .setup, message: String(cString: curl_multi_strerror(added)))))
        }
    }

    /// Sets every option of one transfer; returns why it cannot run.
    private func configure(_ handle: UnsafeMutableRawPointer, _ transfer: Transfer) -> HTTPClientError? {
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
    private static func isNamed(_ name: String, _ lowercased: StaticString) -> Bool {
        guard name.utf8.count == lowercased.utf8CodeUnitCount else { return false }
        return zip(name.utf8, UnsafeBufferPointer(start: lowercased.utf8Start, count: lowercased.utf8CodeUnitCount)).allSatisfy { $0 | 0x20 == $1 | 0x20 }
    }

    /// A new easy handle with the options every transfer shares.
    private func newHandle() -> UnsafeMutableRawPointer? {
        guard let handle = curl_easy_init() else { return nil }
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
        guard codes.allSatisfy({ $0 == CURLE_OK }) else {
            curl_easy_cleanup(handle)
            return nil
        }
        return handle
    }

    private func isHTTPS(_ url: String) -> Bool {
        var bytes = url.utf8.makeIterator()
        for expected in "https:".utf8 {
            guard let byte = bytes.next(), byte | 0x20 == expected | 0x20 else { return false }
        }
        return true
    }

    private func collectFinished() {
        var queued: Int32 = 0
        while let message = curl_multi_info_read(multi, &queued) {
            guard relay_curl_msg_is_done(message) != 0, let handle = relay_curl_msg_easy(message) else { continue }
            let code = relay_curl_msg_result(message)
            _ = curl_multi_remove_handle(multi, handle)
            guard let transfer = running.removeValue(forKey: handle) else { continue }
            var result = HTTPTransferResult()
            if code == CURLE_OK {
                var status = 0
                _ = relay_curl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
                var connects = 0
                _ = relay_curl_getinfo_long(handle, CURLINFO_NUM_CONNECTS, &connects)
                result.response = HTTPClientResponse(
                    status: status, headers: transfer.response.headers, body: transfer.response.body, newConnections: connects,
                    bodyTruncated: transfer.response.truncated)
            } else if let refusal = transfer.refusal {
                result.error = HTTPClientError(kind: .addressRefused, message: refusal)
            } else {
                result.error = HTTPClientError(code: code)
            }
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, result)
        }
    }

    /// Removes every running transfer from the multi handle and completes it as `.aborted`. Its
    /// connection is closed (libcurl does not reuse one left mid-exchange).
    private func abortAll() {
        let aborted = running
        running = [:]
        for (handle, transfer) in aborted {
            _ = curl_multi_remove_handle(multi, handle)
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, Self.abortedResult)
        }
    }

    private static let abortedResult = HTTPTransferResult(error: HTTPClientError(kind: .aborted, message: "aborted: the process is shutting down"))

    private func complete(_ transfer: Transfer, _ result: HTTPTransferResult) {
        transfer.completion(result)
    }
}

extension HTTPClientError {
    init(code: CURLcode) {
        let message = String(cString: curl_easy_strerror(code))
        let kind: Kind =
            switch code {
            case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST: .connect
            case CURLE_OPERATION_TIMEDOUT: .timeout
            case CURLE_URL_MALFORMAT, CURLE_UNSUPPORTED_PROTOCOL: .invalidRequest
            default: .transfer
            }
        self.init(kind: kind, message: message)
    }
}

private func engineWatchSocket(
    _ easy: UnsafeMutableRawPointer?, _ socket: curl_socket_t, _ what: Int32, _ context: UnsafeMutableRawPointer?, _ socketContext: UnsafeMutableRawPointer?
) -> Int32 {
    guard let context else { return -1 }
    Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue().watch(socket, what)
    return 0
}

private func engineSetTimer(_ multi: UnsafeMutableRawPointer?, _ timeoutMilliseconds: Int, _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return -1 }
    let loop = Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue()
    // At most a minute ahead (the loop wakes at least every second anyway): libcurl handles an early
    // CURL_SOCKET_TIMEOUT by setting the timer again, and a huge configured timeout cannot overflow.
    loop.timerDeadline =
        timeoutMilliseconds < 0 ? nil : DispatchTime.now().uptimeNanoseconds + UInt64(min(timeoutMilliseconds, 60_000)) * 1_000_000
    return 0
}

private func engineOpenSocket(_ context: UnsafeMutableRawPointer?, _ purpose: curlsocktype, _ address: UnsafeMutablePointer<curl_sockaddr>?) -> curl_socket_t {
    guard let context, let address else { return CURL_SOCKET_BAD }
    let transfer = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
    guard let check = transfer.addressCheck else { return openOwnSocket(address, for: transfer) }
    var text = [CChar](repeating: 0, count: 64)
    guard relay_curl_sockaddr_ip(address, &text, socklen_t(text.count)) == 0 else {
        transfer.refusal = "refused a connection to an address that is not IPv4 or IPv6"
        return CURL_SOCKET_BAD
    }
    let ip = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    if let reason = check(ip) {
        transfer.refusal = "refused to connect to \(ip): \(reason)"
        return CURL_SOCKET_BAD
    }
    return openOwnSocket(address, for: transfer)
}

private func openOwnSocket(_ address: UnsafeMutablePointer<curl_sockaddr>, for transfer: Transfer) -> curl_socket_t {
    let socket = relay_curl_open_socket(address)
    if socket >= 0 { transfer.loop?.opened(socket) }
    return socket
}

private func engineCloseSocket(_ context: UnsafeMutableRawPointer?, _ socket: curl_socket_t) -> Int32 {
    if let context { Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue().closing(socket) }
    return relay_close_socket(socket)
}
