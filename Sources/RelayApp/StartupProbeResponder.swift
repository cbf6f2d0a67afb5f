import Dispatch
#if canImport(Glibc)
import Glibc
#endif
import Logging
import RelayConfig
import RelayCore

/// Answers on the process's listen addresses while it opens its stores, before its HTTP servers start.
///
/// Opening can take long: the first start of a version that moves the events store into its own file
/// copies the whole store first (docs/operations.md, Upgrading), and an embedded log or a database another
/// process holds can make it wait. Without an answer, an orchestrator's liveness or startup probe counts
/// refused connections and kills the process mid-open, again at every restart. This answers each request
/// with one of:
/// - `GET /health/live`: 200 `{"status":"live"}`, as the server will;
/// - `GET /health/ready`: 503 `{"status":"not_ready","reasons":["starting"]}`: no traffic yet;
/// - anything else: 503 `{"error":"starting",…}` with `Retry-After: 5`, so a store's notification or an SDK's
///   request is retried, as it would be after a refused connection.
///
/// It listens only where the process will (port 0 is left out: nobody can probe a port not yet chosen), on
/// one thread of its own with blocking socket calls, one short request at a time, and closes its sockets
/// when stopped, before the servers bind the same addresses. An address it cannot bind is left to the
/// server, which reports it.
final class StartupProbeResponder: Sendable {
    private let listeners: [Int32]
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let finished = DispatchSemaphore(value: 0)

    /// A request's head larger than this, or slower than `readTimeoutMilliseconds`, is answered as it stands.
    static let maximumRequestBytes = 4_096
    static let readTimeoutMilliseconds = 500

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

    /// Stops answering and closes the listening sockets; returns once they are closed.
    func stop() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
        finished.wait()
        _ = close(wakeWrite)
    }

    private func serve(logger: Logger) {
        defer {
            listeners.forEach { _ = close($0) }
            _ = close(wakeRead)
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
            for index in polled.indices.dropLast() where polled[index].revents != 0 {
                polled[index].revents = 0
                let client = accept(polled[index].fd, nil, nil)
                guard client >= 0 else { continue }
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                answer(client)
                _ = close(client)
            }
        }
    }

    /// Reads the request's head (bounded in size and time) and writes the answer for its line.
    private func answer(_ client: Int32) {
        var timeout = timeval(tv_sec: 0, tv_usec: Int(Self.readTimeoutMilliseconds) * 1_000)
        _ = setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var head: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1_024)
        while head.count < Self.maximumRequestBytes, !Self.endsHead(head) {
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            head += chunk[..<count]
        }
        let response = Self.response(toHead: head)
        _ = response.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    private static func endsHead(_ head: [UInt8]) -> Bool {
        head.count >= 4 && head[(head.count - 4)...].elementsEqual([13, 10, 13, 10])
    }

    /// The whole HTTP/1.1 response to a request whose head (or what arrived of it) is `head`.
    static func response(toHead head: [UInt8]) -> [UInt8] {
        let line = head.split(separator: 13, maxSplits: 1, omittingEmptySubsequences: false).first.map { String(decoding: $0, as: UTF8.self) } ?? ""
        let parts = line.split(separator: " ")
        let method = parts.first.map(String.init) ?? ""
        let target = parts.count > 1 ? String(parts[1].prefix { $0 != "?" }) : ""
        let status: String
        let body: String
        var extra = ""
        switch (method, target) {
        case ("GET", "/health/live"), ("HEAD", "/health/live"):
            status = "200 OK"
            body = #"{"status":"live"}"#
        case ("GET", "/health/ready"), ("HEAD", "/health/ready"):
            status = "503 Service Unavailable"
            body = #"{"reasons":["starting"],"status":"not_ready"}"#
        default:
            status = "503 Service Unavailable"
            body = #"{"detail":"the process is opening its stores; retry","error":"starting"}"#
            extra = "Retry-After: 5\r\n"
        }
        let response = "HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\(extra)Connection: close\r\n\r\n"
            + (method == "HEAD" ? "" : body)
        return Array(response.utf8)
    }

    /// A listening socket on `address` with SO_REUSEADDR, as the servers bind after it; nil if it cannot be made.
    private static func listen(_ address: ListenAddress) -> Int32? {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var results: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(address.host, String(address.port), &hints, &results) == 0, let first = results else { return nil }
        defer { freeaddrinfo(results) }
        let fd = socket(first.pointee.ai_family, first.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue), first.pointee.ai_protocol)
        guard fd >= 0 else { return nil }
        var yes: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0, Glibc.listen(fd, 64) == 0 else {
            _ = close(fd)
            return nil
        }
        return fd
    }
}
