internal import CCurl
import Foundation
import RelayCore
import Synchronization

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

/// The engine's thread and everything it owns. The multi handle, the epoll set, the easy-handle pool
/// and the running transfers are touched only on that thread; `submit` and `close` hand over through
/// the mutex and wake the thread through an eventfd.
///
/// Event-driven (`curl_multi_socket_action`): libcurl names the sockets to watch and its next timeout,
/// one `epoll_wait` reports every ready socket, and only the transfers on those sockets run. (The
/// `curl_multi_perform` loop it replaces visited every running transfer on every wake-up.)
final class TransferLoop: @unchecked Sendable {
    struct Inbox {
        var pending: [Transfer] = []
        var closed = false
        var abort = false
    }

    private let multi: UnsafeMutableRawPointer
    private let epoll: Int32
    private let wakeUp: Int32
    let configuration: HTTPTransferEngine.Configuration
    private let inbox = Mutex(Inbox())
    let finished = Eventual<Void>()
    let wakeUps = Atomic<Int>(0)
    /// `registrations.count << 32 | parkedCount`, published for tests.
    let registeredSockets = Atomic<Int>(0)
    // Engine thread only.
    private var running: [UnsafeMutableRawPointer: (handle: EasyHandle, transfer: Transfer)] = [:]
    private var idleHandles: [EasyHandle] = []
    /// When libcurl wants `CURL_SOCKET_TIMEOUT` handled (uptime nanoseconds), or nil for no timer.
    var timerDeadline: UInt64?

    let keptHeaders: [[UInt8]]?

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

            publishSocketCounts()
            let ready = relay_epoll_wait(epoll, &fds, &flags, Int32(capacity), waitMilliseconds())
            wakeUps.add(1, ordering: .relaxed)
            sockets.beginBatch()
            for index in 0..<Int(max(0, ready)) {
                if fds[index] == wakeUp {
                    relay_eventfd_drain(wakeUp)
                    continue
                }
                switch sockets.event(fds[index]) {
                case .act: _ = curl_multi_socket_action(multi, fds[index], flags[index], &stillRunning)
                case .unpark: _ = relay_epoll_watch(epoll, fds[index], CURL_POLL_REMOVE, 0)
                case .stale, nil: break
                }
            }
            if let deadline = timerDeadline, DispatchTime.now().uptimeNanoseconds >= deadline {
                timerDeadline = nil
                _ = curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &stillRunning)
            }
            collectFinished()
        }
        idleHandles = []
        // Closes the cached connections (each leaving the epoll set first, in `closing`).
        curl_multi_cleanup(multi)
        publishSocketCounts()
        Glibc.close(epoll)
        finished.set(())
    }

    private func publishSocketCounts() {
        registeredSockets.store(sockets.registeredCount << 32 | sockets.parkedCount, ordering: .relaxed)
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

    /// The epoll registrations. Engine thread only.
    private var sockets = SocketRegistry()

    /// libcurl's socket callback: watch `socket` for `what` (see `SocketRegistry`).
    func watch(_ socket: curl_socket_t, _ what: Int32) {
        apply(sockets.watch(socket, what), socket)
    }

    /// A socket `engineOpenSocket` opened.
    func opened(_ socket: curl_socket_t) {
        sockets.opened(socket)
    }

    /// libcurl is about to close an own socket: it leaves the epoll set first.
    func closing(_ socket: curl_socket_t) {
        apply(sockets.closing(socket), socket)
    }

    /// Makes the `epoll_ctl` change the registry asked for.
    private func apply(_ change: SocketRegistry.Change, _ socket: curl_socket_t) {
        switch change {
        case .none:
            break
        case .remove:
            _ = relay_epoll_watch(epoll, socket, CURL_POLL_REMOVE, 0)
        case .watch(let interest, let add):
            let succeeded = relay_epoll_watch(epoll, socket, interest, add ? 1 : 0) == 0
            apply(sockets.applied(socket, interest, succeeded: succeeded), socket)
        }
    }

    private func start(_ transfer: Transfer) {
        guard let handle = idleHandles.popLast() ?? newHandle() else {
            complete(transfer, HTTPTransferResult(error: HTTPClientError(kind: .setup, message: "libcurl could not create a transfer")))
            return
        }
        if let failure = configure(handle.pointer, transfer) {
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, HTTPTransferResult(error: failure))
            return
        }
        running[handle.pointer] = (handle, transfer)
        let added = curl_multi_add_handle(multi, handle.pointer)
        if added != CURLM_OK {
            running[handle.pointer] = nil
            transfer.freeHeaders()
            idleHandles.append(handle)
            complete(transfer, HTTPTransferResult(error: HTTPClientError(kind: .setup, message: String(cString: curl_multi_strerror(added)))))
        }
    }

    private func collectFinished() {
        var queued: Int32 = 0
        while let message = curl_multi_info_read(multi, &queued) {
            guard relay_curl_msg_is_done(message) != 0, let handle = relay_curl_msg_easy(message) else { continue }
            let code = relay_curl_msg_result(message)
            _ = curl_multi_remove_handle(multi, handle)
            guard let (easy, transfer) = running.removeValue(forKey: handle) else { continue }
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
            idleHandles.append(easy)
            complete(transfer, result)
        }
    }

    /// Removes every running transfer from the multi handle and completes it as `.aborted`. Its
    /// connection is closed (libcurl does not reuse one left mid-exchange).
    private func abortAll() {
        let aborted = running
        running = [:]
        for (pointer, (handle, transfer)) in aborted {
            _ = curl_multi_remove_handle(multi, pointer)
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
