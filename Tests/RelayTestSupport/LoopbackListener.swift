import Foundation
public import Synchronization

/// A TCP socket listening on 127.0.0.1 on a port the kernel chose, accepting on its own thread, for
/// test servers on raw sockets.
public final class LoopbackListener: Sendable {
    public let port: Int
    /// Connections accepted so far.
    public let connections = Atomic<Int>(0)
    private let socket: Int32
    private let stopped = Atomic<Bool>(false)

    public struct Failed: Error {}

    /// Listens, and hands every accepted connection to `handle` on the accepting thread.
    public init(_ handle: @escaping @Sendable (Int32) -> Void) throws {
        // Close-on-exec: a child process a test starts must not inherit the listener or its connections.
        let fd = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        guard fd >= 0, bound == 0, listen(fd, 64) == 0 else {
            if fd >= 0 { Glibc.close(fd) }
            throw Failed()
        }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        port = Int(UInt16(bigEndian: address.sin_port))
        socket = fd
        Thread { [self] in
            while !stopped.load(ordering: .relaxed) {
                let client = accept(fd, nil, nil)
                guard client >= 0 else { continue }
                // accept4 is not visible to Swift here; a spawn between these two calls is the only gap.
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                connections.add(1, ordering: .relaxed)
                handle(client)
            }
        }.start()
    }

    /// Stops listening; the accepting thread ends.
    public func close() {
        stopped.store(true, ordering: .relaxed)
        shutdown(socket, Int32(SHUT_RDWR))
        Glibc.close(socket)
    }
}
