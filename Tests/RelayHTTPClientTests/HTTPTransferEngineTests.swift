import Foundation
import Synchronization
@testable import RelayHTTPClient
import RelayTestSupport
import Testing

/// The deliverer's transfer engine against a real server on 127.0.0.1.
@Suite struct HTTPTransferEngineTests {
    @Test func postsTheBodyKeepsOnlyTheWantedHeadersAndRefusesAddressesTheCheckRejects() async throws {
        let server = try await TestHTTPServer { request in
            TestHTTPResponse(
                status: 429, headers: [("Retry-After", " 120 "), ("X-Other", "x")], body: Array("slow down".utf8) + request.body)
        }
        var configuration = HTTPTransferEngine.Configuration()
        configuration.keptResponseHeaders = ["retry-after"]
        configuration.maxResponseBytes = 12
        let engine = try HTTPTransferEngine(configuration: configuration)
        let result = await engine.send(
            HTTPTransferRequest(url: server.baseURL + "/hook", headers: [("X-Id", "1")], body: Array(" body".utf8), timeout: .seconds(5)))
        let response = try #require(result.response)
        #expect(response.status == 429)
        #expect(response.headers.map(\.name) == ["retry-after"])
        #expect(response.header("Retry-After") == "120")
        #expect(response.bodyText == "slow down bo", "the body is cut at maxResponseBytes")
        #expect(server.requests.first?.headers["x-id"] == "1")
        #expect(server.requests.first?.headers["expect"] == nil)
        #expect(server.requests.first?.headers["user-agent"] == "revenue-relay")
        #expect(server.requests.first?.headers["content-length"] == "5")
        #expect(server.requests.first?.body == Array(" body".utf8))

        // Every header goes out as given, an empty one included; a line break or NUL in one refuses the request.
        let many = await engine.send(
            HTTPTransferRequest(
                url: server.baseURL + "/hook",
                headers: [("X-A", "a"), ("X-Empty", ""), ("X-Long", String(repeating: "v", count: 3000)), ("user-agent", "custom/1")],
                body: [], timeout: .seconds(5)))
        #expect(many.response?.status == 429)
        let headers = try #require(server.requests.last?.headers)
        #expect(headers["x-a"] == "a" && headers["x-empty"] == "" && headers["x-long"]?.count == 3000)
        #expect(headers["user-agent"] == "custom/1", "the caller's User-Agent replaces the engine's")
        for bad in [("X-Bad", "a\r\nX-Injected: 1"), ("X-Bad:", "a"), ("X-Bad", "a\u{0}b"), ("", "a")] {
            let refused = await engine.send(HTTPTransferRequest(url: server.baseURL, headers: [bad], body: [], timeout: .seconds(5)))
            #expect(refused.error?.kind == .invalidRequest)
        }
        #expect(server.requests.count == 2)
        await engine.close()

        var guarded = HTTPTransferEngine.Configuration()
        guarded.addressCheck = { $0 == "127.0.0.1" ? "loopback" : nil }
        let guardedEngine = try HTTPTransferEngine(configuration: guarded)
        let refused = await guardedEngine.send(HTTPTransferRequest(url: server.baseURL, headers: [], body: [], timeout: .seconds(5)))
        #expect(refused.error?.kind == .addressRefused)
        #expect(refused.error?.message == "refused to connect to 127.0.0.1: loopback")
        #expect(server.requests.count == 2)
        await guardedEngine.close()
        await server.stop()
    }

    @Test func abortEndsRunningTransfersAndLaterOnesAtOnceSoCloseDoesNotWaitForTheirTimeout() async throws {
        // A server that accepts and never answers.
        let held = LockedBox<[Int32]>([])
        let silent = try LoopbackListener { fd in held.withLock { $0.append(fd) } }
        defer {
            silent.close()
            for fd in held.value { close(fd) }
        }
        let engine = try HTTPTransferEngine()
        let request = HTTPTransferRequest(url: "http://127.0.0.1:\(silent.port)/slow", headers: [], body: Array("{}".utf8), timeout: .seconds(600))
        let results = LockedBox<[HTTPTransferResult]>([])
        for _ in 0..<3 { engine.submit(request) { result in results.withLock { $0.append(result) } } }
        try await waitUntil("the transfers reached the server") { silent.connections.load(ordering: .relaxed) >= 3 }
        engine.abortRunning()
        try await waitUntil("the running transfers were aborted") { results.value.count == 3 }
        #expect(results.value.allSatisfy { $0.error?.kind == .aborted && $0.response == nil })
        // Submitted after the abort: aborted too, not left running into close().
        let late = await engine.send(request)
        #expect(late.error?.kind == .aborted)
        let closing = ContinuousClock.now
        await engine.close()
        #expect(ContinuousClock.now - closing < .seconds(60))
    }

    @Test func reusesKeptAliveConnectionsAndReconnectsAfterTheServerClosedAnIdleOne() async throws {
        let server = try KeepAliveServer()
        defer { server.stop() }
        let engine = try HTTPTransferEngine()
        let url = "http://127.0.0.1:\(server.port)/hook"
        func post(_ text: String) async -> Int? {
            await engine.send(HTTPTransferRequest(url: url, headers: [], body: Array(text.utf8), timeout: .seconds(5))).response?.status
        }
        /// Posts with the answer held back until the engine waits for it on a registered socket, so
        /// the answer comes through epoll (not read at once after sending).
        func postWhenWaited(_ text: String) async throws -> Int? {
            server.connections.holdAnswers.store(true, ordering: .relaxed)
            let answer = Task { await post(text) }
            try await waitUntil("the engine waiting for the answer to \(text)", timeout: .seconds(20)) {
                server.connections.bodies.withLock { $0.contains(text) }
                    && engine.registeredSockets.all > engine.registeredSockets.parked
            }
            server.connections.holdAnswers.store(false, ordering: .relaxed)
            return await answer.value
        }

        #expect(await post("one") == 204)
        #expect(try await postWhenWaited("two") == 204)
        #expect(server.accepted == 1, "the idle connection was reused")
        // Its socket stays registered with epoll while idle.
        try await waitUntil("the idle socket parked", timeout: .seconds(20)) { engine.registeredSockets == (1, 1) }

        // The server closes the connection after its next answer, while it sits idle in libcurl's cache.
        server.connections.closeAfterNextAnswer.store(true, ordering: .relaxed)
        #expect(await post("three") == 204)
        // The closed connection's socket, readable at its end, leaves the set and does not keep the
        // engine awake.
        try await waitUntil("the closed idle socket left the set", timeout: .seconds(20)) { engine.registeredSockets.all == 0 }
        let wakeUps = engine.wakeUps
        try await Task.sleep(for: .milliseconds(300))
        #expect(engine.wakeUps - wakeUps <= 3, "the idle engine slept")
        #expect(await post("four") == 204)
        #expect(server.accepted == 2, "a new connection replaced the closed one")

        // Many at once, each on a connection of its own, all answered.
        let statuses = await withTaskGroup(of: Int?.self) { group in
            for index in 0..<40 { group.addTask { await post("burst \(index)") } }
            return await group.reduce(into: [Int?]()) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 204, count: 40))
        #expect(server.connections.bodies.withLock { $0.filter { $0.hasPrefix("burst") }.count } == 40)
        #expect(try await postWhenWaited("last") == 204)
        try await waitUntil("idle sockets parked", timeout: .seconds(20)) { engine.registeredSockets.parked > 0 }
        // Closing the cached connections takes every socket out of the set before closing it.
        await engine.close()
        #expect(engine.registeredSockets.all == 0)
    }
}

/// A keep-alive HTTP/1.1 server on raw sockets that answers 204 and can close a connection after an
/// answer, as servers do with idle connections.
final class KeepAliveServer: Sendable {
    final class Connections: Sendable {
        let closeAfterNextAnswer = Atomic<Bool>(false)
        /// Answers wait while this is set.
        let holdAnswers = Atomic<Bool>(false)
        let bodies = Mutex<[String]>([])

        /// Answers each request on one connection until the client or `closeAfterNextAnswer` ends it.
        func serve(_ client: Int32) {
            defer { Glibc.close(client) }
            var buffer: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                // One request: the head, then Content-Length bytes of body.
                while true {
                    if let end = buffer.firstRange(of: Array("\r\n\r\n".utf8))?.upperBound {
                        let head = String(decoding: buffer[..<end], as: UTF8.self).lowercased()
                        let length = head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                            .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
                        if buffer.count >= end + length {
                            bodies.withLock { $0.append(String(decoding: buffer[end..<(end + length)], as: UTF8.self)) }
                            buffer.removeFirst(end + length)
                            break
                        }
                    }
                    let got = read(client, &chunk, chunk.count)
                    guard got > 0 else { return }
                    buffer += chunk[..<got]
                }
                while holdAnswers.load(ordering: .relaxed) { usleep(1000) }
                // Decided before answering: once the answer is out, the client may already have set
                // the flag for its next request.
                let closing = closeAfterNextAnswer.exchange(false, ordering: .relaxed)
                let answer = Array("HTTP/1.1 204 No Content\r\n\r\n".utf8)
                guard write(client, answer, answer.count) == answer.count else { return }
                if closing { return }
            }
        }
    }

    let connections: Connections
    private let listener: LoopbackListener
    var port: Int { listener.port }
    var accepted: Int { listener.connections.load(ordering: .relaxed) }

    init() throws {
        let connections = Connections()
        self.connections = connections
        // Each connection on a thread of its own.
        listener = try LoopbackListener { client in Thread { connections.serve(client) }.start() }
    }

    func stop() { listener.close() }
}
