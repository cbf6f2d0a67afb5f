import Dispatch
import Foundation
import GRDB
@testable import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayLocalBackend
import RelayTestSupport
import Testing

/// Another connection in a write transaction on a SQLite file, until `release()`: what a long open (the events
/// store's move) looks like from outside, without a store large enough to take that long.
private final class WriteLockHolder: Sendable {
    private let released = DispatchSemaphore(value: 0)

    init(path: String) async throws {
        let queue = try DatabaseQueue(path: path)
        try await queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA journal_mode = WAL") }
        let release = released
        await withCheckedContinuation { (held: CheckedContinuation<Void, Never>) in
            Thread {
                try? queue.inTransaction(.immediate) { _ in
                    held.resume()
                    release.wait()
                    return .rollback
                }
            }.start()
        }
    }

    func release() { released.signal() }
}

/// Runs a blocking call on a thread of its own, off Swift's cooperative pool.
private func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

@Suite struct StartupProbeTests {
    /// A port nothing listens on (the kernel's choice, released at once).
    private func freePort() throws -> Int {
        let listener = try LoopbackListener { Glibc.close($0) }
        defer { listener.close() }
        return listener.port
    }

    @Test func theProbesAreAnsweredWhileTheStoresOpenAndTheServersTakeTheAddressesAfter() async throws {
        var configuration = try TestRelay.configuration()
        configuration.ingest.listen = ListenAddress(host: "127.0.0.1", port: try freePort())
        configuration.backend.listen = ListenAddress(host: "127.0.0.1", port: try freePort())
        configuration.metrics.listen = ListenAddress(host: "127.0.0.1", port: try freePort())
        let data = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-data")).path
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        // The backend's open waits for this lock (up to its 10 s busy timeout) as it would work through a long move.
        let lock = try await WriteLockHolder(path: SubscriptionDatabase.eventsPath(forBackend: data + "/backend.sqlite"))
        let opened = LockedBox(false)
        let opening = Task { [configuration] in
            try await onThread {
                defer { opened.withLock { $0 = true } }
                return try DevEnvironment(
                    configuration: configuration, dataDirectory: data, kafka: false, logger: testLogger("relay"), installSignalHandlers: false)
            }
        }
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(10))
        let ingest = "http://127.0.0.1:\(configuration.ingest.listen.port)"
        let metrics = "http://127.0.0.1:\(configuration.metrics.listen!.port)"
        let backend = "http://127.0.0.1:\(configuration.backend.listen.port)"

        do {
            try await waitUntil("the liveness probe answers during the open", timeout: .seconds(8)) {
                (try? await http.send("GET", metrics + "/health/live"))?.status == 200
            }
            #expect(String(decoding: try await http.send("GET", ingest + "/health/live").body, as: UTF8.self) == #"{"status":"live"}"#)
            for base in [ingest, metrics, backend] {
                let ready = try await http.send("GET", base + "/health/ready")
                #expect(ready.status == 503)
                #expect(try JSON.parse(ready.body)["reasons"] == .array([.string("starting")]), "\(base)")
            }
            // A client that trickles its request a byte at a time holds the one thread for its deadline at most,
            // then is answered and closed: the probes behind it are answered (it used to hold the thread for as
            // long as the bytes kept coming, here a minute, past the probe's 10 s timeout).
            let trickler = try RawConnection(port: configuration.ingest.listen.port)
            let trickling = Task {
                for byte in String(repeating: "GET /health/live", count: 13).map(String.init) {
                    guard !Task.isCancelled, (try? trickler.send(byte)) != nil else { return }
                    try? await Task.sleep(for: .milliseconds(300))
                }
            }
            defer { trickling.cancel() }
            #expect(await trickler.closedByPeer(within: .seconds(8)), "the trickling client was not cut off")
            #expect(try await http.send("GET", metrics + "/health/live").status == 200)
            // A small POST whose head and body arrive together is answered at once, not at the deadline.
            let small = try await http.send("POST", ingest + "/v1/notifications/stripe/demo", body: Array(#"{"id":"evt_small"}"#.utf8))
            #expect(small.status == 503)
            // A store's notification (its body unread: the answer must arrive, not a reset) or an SDK's request is
            // told to come back, not refused.
            let body = Array(#"{"id":"evt_during_the_open","pad":""#.utf8) + [UInt8](repeating: UInt8(ascii: "x"), count: 64 * 1024) + Array(#""}"#.utf8)
            for (method, url) in [("POST", ingest + "/v1/notifications/stripe/demo"), ("GET", backend + "/v1/customers/u1/entitlements")] {
                let answer = try await http.send(method, url, body: method == "POST" ? body : nil)
                #expect(answer.status == 503, "\(url)")
                #expect(answer.headers.contains { $0.name == "retry-after" && $0.value == "5" }, "\(url)")
                #expect(try JSON.parse(answer.body)["error"]?.stringValue == "starting", "\(url)")
            }
            #expect(!opened.value, "the open ended before the probes were answered: the test proved nothing")
        } catch {
            lock.release()
            _ = try? await opening.value
            throw error
        }
        lock.release()

        // Once open, the process's own servers bind the same addresses and answer.
        let process = try await opening.value.process
        let running = Task { try await process.run() }
        #expect(await process.waitForHTTPPort() == configuration.ingest.listen.port)
        try await waitUntil("the process is ready") {
            (try? await http.send("GET", ingest + "/health/ready"))?.status == 200
        }
        #expect((try await http.send("GET", metrics + "/metrics")).status == 200)
        await process.triggerGracefulShutdown()
        try await running.value
    }

    @Test func eachRequestLineGetsItsAnswer() throws {
        func answer(_ head: String) -> String { String(decoding: StartupProbeResponder.response(toHead: Array(head.utf8)), as: UTF8.self) }
        #expect(answer("GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n").hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(answer("GET /health/live?probe=1 HTTP/1.1\r\n\r\n").hasSuffix(#"{"status":"live"}"#))
        #expect(answer("GET /health/live HTTP/1.1\nHost: x\n\n").hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(answer("GET /health/live HTTP/1.1\r\n").hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(answer("HEAD /health/live HTTP/1.1\r\n\r\n").hasSuffix("\r\n\r\n"))
        #expect(answer("GET /health/ready HTTP/1.1\r\n\r\n").hasPrefix("HTTP/1.1 503 "))
        #expect(!answer("GET /health/ready HTTP/1.1\r\n\r\n").contains("Retry-After"))
        // A probe of liveness by another method, a half-sent line, garbage: not live, come back later.
        for head in ["POST /health/live HTTP/1.1\r\n\r\n", "GET /health/li", "", "\u{0}\u{1}"] {
            let text = answer(head)
            #expect(text.hasPrefix("HTTP/1.1 503 ") && text.contains("Retry-After: 5\r\n"), "\(head.debugDescription)")
        }
    }
}
