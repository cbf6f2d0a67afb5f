import Dispatch
#if canImport(Glibc)
import Glibc
#endif
import Logging
import RelayConfig
import RelayCore
import RelayIngest

/// Answers on the process's listen addresses while it opens its stores, before its HTTP servers start.
///
/// Opening can take long: the first start of a version that moves the events store into its own file
/// copies the whole store first (docs/operations.md, Upgrading), and a database another connection is
/// writing makes it wait (up to the 10 s busy timeout). Without an answer, an orchestrator's liveness or startup probe counts
/// refused connections and kills the process mid-open, again at every restart. This answers each request
/// with one of:
/// - `GET /health/live`: 200 `{"status":"live"}`, as the server will;
/// - `GET /health/ready`: 503 `{"status":"not_ready","reasons":["starting"]}`: no traffic yet;
/// - anything else: 503 `{"error":"starting",…}` with `Retry-After: 5`, so a store's notification or an SDK's
///   request is retried, as it would be after a refused connection.
///
/// It listens only where the process will (port 0 is left out: nobody can probe a port not yet chosen; a
/// name is bound at its first address), on one thread of its own, one connection at a time and each for at
/// most half a second, and closes its sockets when stopped, before the servers bind the same addresses. An
/// address it cannot bind is left to the server, which reports it.
///
/// Liveness then holds from the first moment: an open that hangs (a stuck disk) is not restarted by a probe,
/// and shows as not ready with the reason `starting` (docs/operations.md, Health and readiness).
final class StartupProbeResponder: Sendable {
    private let listeners: [Int32]
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let finished = DispatchSemaphore(value: 0)

    /// A request line longer than this is answered as it stands.
    static let maximumRequestBytes = 4_096
    /// All the time one connection gets, its request read and its body drained: a client that trickles bytes
    /// must not hold the one thread (and the probes behind it) for longer.
    static let connectionDeadlineMilliseconds = 500

    /// Listens on `addresses` (those with a port) and answers until `stop()`; nil when none could be bound.
    static func start(_ addresses: [ListenAddress], logger: Logger) -> StartupProbeResponder? {
        let listeners = addresses.filter { $0.port != 0 }.compactMap(Self.listen)
        guard !listeners.isEmpty else { return nil }
        var pipeEnds: [Int32] = [0, 0]
        // Close-on-exec, as every descriptor of the process: a child it spawns must not hold them (pipe2 and
        // accept4 are not visible to Swift here; nothing spawns before the process has started).
        guard pipe(&pipeEnds) == 0 else {
            listeners.forEach { _ = close($0) }
            return nil
        }
        pipeEnds.forEach { _ = fcntl($0, F_SETFD, FD_CLOEXEC) }
        let responder = StartupProbeResponder(listeners: listeners, wakeRead: pipeEnds[0], wakeWrite: pipeEnds[1])
        startDedicatedThread(named: "startup-probes") { responder.serve(logger: logger) }
        return responder
    }

    private init(listeners: [Int32], wakeRead: Int32, wakeWrite: Int32) {
        self.listeners = listeners
        self.wakeRead = wakeRead
        self.wakeWrite = wakeWrite
    }

    /// Stops answering (a connection being served is dropped) and closes the listening sockets; returns once
    /// they are closed. The pipe's read end is closed only here, after the thread is done, so the wake-up never
    /// writes to a pipe without a reader (SIGPIPE), even if the thread stopped early.
    func stop() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
        finished.wait()
        _ = close(wakeWrite)
        _ = close(wakeRead)
    }

    private func serve(logger: Logger) {
        defer {
            listeners.forEach { _ = close($0) }
            finished.signal()
        }
        var polled = listeners.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        polled.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
        while true {
            let ready = poll(&polled, nfds_t(polled.count), -1)
            if ready < 0 {
                if errno == EINTR { continue }
                logger.warning("the startup probe responder stopped answering", metadata: ["error": "\(String(cString: strerror(errno)))"])
                return
            }
            if polled[polled.count - 1].revents != 0 { return }
            // One connection, from the first listener that has one, then poll again: the listeners are in the
            // order they were given (the probes' address first), so a flood of connections held open on another
            // address delays a probe by one connection's deadline at most.
            guard let index = polled.indices.dropLast().first(where: { polled[$0].revents != 0 }) else { continue }
            for other in polled.indices { polled[other].revents = 0 }
            // The listeners are non-blocking: a connection gone before this accept is EAGAIN, not a hang.
            let client = accept(polled[index].fd, nil, nil)
            guard client >= 0 else {
                // Out of descriptors (or another failure): the connection stays queued; do not spin on it.
                if errno != EAGAIN, errno != EWOULDBLOCK, errno != EINTR { usleep(10_000) }
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            let stopping = !answer(client)
            _ = close(client)
            if stopping { return }
        }
    }

    /// Reads the request's line (the answer depends on nothing else) and writes the answer, within the
    /// connection's deadline; then half-closes and reads what the client still sends (the rest of its head, a
    /// notification's body), so that closing sends FIN, not a reset that could lose the answer. Returns false
    /// when `stop()` interrupted it.
    private func answer(_ client: Int32) -> Bool {
        let deadline = ContinuousClock.now + .milliseconds(Self.connectionDeadlineMilliseconds)
        var head: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        // Readable within the deadline: true; nil when stopping.
        func readable() -> Bool? {
            let remaining = deadline - .now
            guard remaining > .zero else { return false }
            var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 2, Int32(max(1, remaining.wholeMilliseconds)))
            if ready < 0, errno == EINTR { return readable() }
            if ready > 0, fds[1].revents != 0 { return nil }
            return ready > 0
        }
        while head.count < Self.maximumRequestBytes, !head.contains(10) {
            guard let ready = readable() else { return false }
            guard ready else { break }
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, min($0.count, Self.maximumRequestBytes - head.count), 0) }
            guard count > 0 else { break }
            head += chunk[..<count]
        }
        let response = Self.response(toHead: head)
        _ = response.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        _ = shutdown(client, Int32(SHUT_WR))
        var drained = 0
        while drained < 1 << 20 {
            guard let ready = readable() else { return false }
            guard ready else { break }
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            drained += count
        }
        return true
    }

    /// The whole HTTP/1.1 response to a request whose head (or what arrived of it, its line at least) is `head`.
    static func response(toHead head: [UInt8]) -> [UInt8] {
        var lineBytes = head.prefix { $0 != 10 }
        if lineBytes.last == 13 { lineBytes = lineBytes.dropLast() }
        let line = String(decoding: lineBytes, as: UTF8.self)
        let parts = line.split(separator: " ")
        let method = parts.first.map(String.init) ?? ""
        let target = parts.count > 1 ? String(parts[1].prefix { $0 != "?" }) : ""
        let status: String
        let body: JSON
        var extra = ""
        // The servers' own bodies (HealthBodies), and an error shaped as the ingest's.
        switch (method, target) {
        case ("GET", "/health/live"), ("HEAD", "/health/live"):
            status = "200 OK"
            body = HealthBodies.live
        case ("GET", "/health/ready"), ("HEAD", "/health/ready"):
            status = "503 Service Unavailable"
            body = HealthBodies.ready(reasons: ["starting"])
        default:
            status = "503 Service Unavailable"
            body = ["error": "starting", "detail": "the process is opening its stores; retry"]
            extra = "Retry-After: 5\r\n"
        }
        let bytes = body.serialized()
        let head = "HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(bytes.count)\r\n\(extra)Connection: close\r\n\r\n"
        return Array(head.utf8) + (method == "HEAD" ? [] : bytes)
    }

    /// A listening socket on `address` with SO_REUSEADDR, as the servers bind after it; nil if it cannot be made.
    private static func listen(_ address: ListenAddress) -> Int32? {
        ListenCheck.withAddresses(address) { first in listen(at: first) } ?? nil
    }

    private static func listen(at first: UnsafeMutablePointer<addrinfo>) -> Int32? {
        let fd = socket(first.pointee.ai_family, first.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue), first.pointee.ai_protocol)
        guard fd >= 0 else { return nil }
        var yes: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0, Glibc.listen(fd, 64) == 0 else {
            _ = close(fd)
            return nil
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        return fd
    }
}
