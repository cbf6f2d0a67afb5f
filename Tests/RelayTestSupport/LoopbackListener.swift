import Foundation

/// A TCP socket listening on 127.0.0.1 on a port the kernel chose, for test servers on raw sockets.
public struct LoopbackListener: Sendable {
    public let socket: Int32
    public let port: Int

    public struct Failed: Error {}

    public init() throws {
        let fd = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
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
    }

    /// Stops listening: a thread blocked in accept returns.
    public func close() {
        shutdown(socket, Int32(SHUT_RDWR))
        Glibc.close(socket)
    }
}
