import Foundation
import RelayCore

/// A plain TCP connection to 127.0.0.1, for tests that send HTTP byte by byte: half-sent requests,
/// transfer codings a client library would not send, connections held open. Blocking socket calls run
/// on their own thread, never on Swift's cooperative pool.
public final class RawConnection: Sendable {
    public struct Failed: Error, CustomStringConvertible {
        public let description: String
    }

    private let fd: Int32

    public init(port: Int) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard fd >= 0, connected == 0 else {
            let message = String(cString: strerror(errno))
            if fd >= 0 { Glibc.close(fd) }
            throw Failed(description: "connect to 127.0.0.1:\(port): \(message)")
        }
        self.fd = fd
    }

    deinit { Glibc.close(fd) }

    public func send(_ text: String) throws {
        let sent = Array(text.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent == text.utf8.count else { throw Failed(description: "send: \(String(cString: strerror(errno)))") }
    }

    /// Whether the peer closed the connection within `limit`, reading and discarding whatever it sent
    /// before. False means it was still open when the limit passed.
    public func closedByPeer(within limit: Duration) async -> Bool {
        let fd = self.fd
        return await withCheckedContinuation { continuation in
            startDedicatedThread(named: "test-raw-conn") {
                let deadline = ContinuousClock.now + limit
                var buffer = [UInt8](repeating: 0, count: 4096)
                while ContinuousClock.now < deadline {
                    var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                    let remaining = ContinuousClock.now.duration(to: deadline).components
                    let milliseconds = Int32(max(1, remaining.seconds * 1000 + remaining.attoseconds / 1_000_000_000_000_000))
                    guard poll(&poller, 1, milliseconds) > 0 else { continue }
                    let count = recv(fd, &buffer, buffer.count, 0)
                    if count <= 0 {
                        continuation.resume(returning: true)
                        return
                    }
                }
                continuation.resume(returning: false)
            }
        }
    }

    /// What the peer sends until it has sent `expected` or closes, or `limit` passes: an HTTP response.
    public func receive(until expected: String, within limit: Duration) async -> String {
        let fd = self.fd
        return await withCheckedContinuation { continuation in
            startDedicatedThread(named: "test-raw-conn") {
                let deadline = ContinuousClock.now + limit
                var received: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 4096)
                while ContinuousClock.now < deadline, !String(decoding: received, as: UTF8.self).contains(expected) {
                    var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                    guard poll(&poller, 1, 50) > 0 else { continue }
                    let count = recv(fd, &buffer, buffer.count, 0)
                    if count <= 0 { break }
                    received += buffer.prefix(count)
                }
                continuation.resume(returning: String(decoding: received, as: UTF8.self))
            }
        }
    }

    /// Reads until the peer closes or `limit` passes, keeping nothing but counts: the bytes received
    /// and how often `marker` occurred (across reads too). For answers too large to hold.
    public func count(_ marker: String, within limit: Duration) async -> (bytes: Int, occurrences: Int) {
        let fd = self.fd
        let pattern = Array(marker.utf8)
        return await withCheckedContinuation { continuation in
            startDedicatedThread(named: "test-raw-conn") {
                let deadline = ContinuousClock.now + limit
                var buffer = [UInt8](repeating: 0, count: 65_536)
                var total = 0
                var occurrences = 0
                var matched = 0
                while ContinuousClock.now < deadline {
                    var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                    guard poll(&poller, 1, 50) > 0 else { continue }
                    let count = recv(fd, &buffer, buffer.count, 0)
                    if count <= 0 { break }
                    total += count
                    for byte in buffer.prefix(count) {
                        if byte == pattern[matched] {
                            matched += 1
                            if matched == pattern.count {
                                occurrences += 1
                                matched = 0
                            }
                        } else {
                            matched = byte == pattern[0] ? 1 : 0
                        }
                    }
                }
                continuation.resume(returning: (total, occurrences))
            }
        }
    }
}
