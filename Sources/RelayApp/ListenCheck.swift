#if canImport(Glibc)
import Glibc
#endif
import RelayConfig

/// Whether an address a process is about to listen on is taken, checked at startup so that a second
/// `dev` or `run` fails at once with the address and its key, instead of starting half its services.
enum ListenCheck {
    /// The address is in use when binding a socket to it (as the server will, with SO_REUSEADDR) fails
    /// with EADDRINUSE. Port 0 and names that do not resolve are left to the server.
    static func isInUse(_ address: ListenAddress) -> Bool {
        guard address.port != 0 else { return false }
        return withAddresses(address) { first in isInUse(first) } ?? false
    }

    /// `body` with the addresses a server listening on `address` binds (`getaddrinfo`, passive, TCP), freed
    /// after; nil when the name does not resolve.
    static func withAddresses<T>(_ address: ListenAddress, _ body: (UnsafeMutablePointer<addrinfo>) -> T) -> T? {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var results: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(address.host, String(address.port), &hints, &results) == 0, let first = results else { return nil }
        defer { freeaddrinfo(results) }
        return body(first)
    }

    private static func isInUse(_ first: UnsafeMutablePointer<addrinfo>) -> Bool {
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let current = entry {
            let fd = socket(current.pointee.ai_family, current.pointee.ai_socktype, current.pointee.ai_protocol)
            if fd >= 0 {
                var yes: Int32 = 1
                _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
                let bound = bind(fd, current.pointee.ai_addr, current.pointee.ai_addrlen)
                let failure = errno
                close(fd)
                if bound != 0, failure == EADDRINUSE { return true }
            }
            entry = current.pointee.ai_next
        }
        return false
    }

    /// Throws a configuration error naming `key` when `address` is in use.
    static func requireFree(_ address: ListenAddress, key: String) throws(ConfigurationError) {
        guard isInUse(address) else { return }
        throw ConfigurationError(
            key: key,
            message: "\(address) is already in use (another revenue-relay, or another program, listens there); stop it or set \(key) to a free address")
    }
}
