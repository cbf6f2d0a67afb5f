import Foundation
import RelayHTTPClient
import RelayTestSupport
import Testing

@Suite struct HTTPClientTests {
    @Test func reusesItsConnectionForTheNextRequest() async throws {
        let server = try await TestHTTPServer { request in TestHTTPResponse(text: "hello \(request.path)") }
        let client = HTTPClient()
        let first = try await client.send("GET", "\(server.baseURL)/one")
        let second = try await client.send("GET", "\(server.baseURL)/two", headers: [("X-Test", "1")])
        #expect(first.bodyText == "hello /one")
        #expect(second.bodyText == "hello /two")
        #expect(first.newConnections == 1)
        #expect(second.newConnections == 0, "kept alive")
        #expect(server.requests.last?.headers["x-test"] == "1")
        await server.stop()
    }

    @Test func boundsConcurrentTransfers() async throws {
        let active = LockedBox((now: 0, most: 0))
        let server = try await TestHTTPServer { _ in
            active.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
            try? await Task.sleep(for: .milliseconds(50))
            active.withLock { $0.now -= 1 }
            return TestHTTPResponse(text: "ok")
        }
        let client = HTTPClient(maxConcurrentTransfers: 3)
        try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<12 { group.addTask { try await client.send("GET", "\(server.baseURL)/\(index)").status } }
            for try await status in group { #expect(status == 200) }
        }
        #expect(active.value.most <= 3)
        #expect(server.requests.count == 12)
        await server.stop()
    }

    @Test func requestsBeyondTheBoundWaitBeforeTheirTimeoutStarts() async throws {
        // Two at a time, each answered after 700 ms, six requests: the last pair starts after 1.4 s. Their
        // 2 s timeout counts from their start, so all succeed (waiting inside libcurl, they would time out).
        let server = try await TestHTTPServer { _ in
            try? await Task.sleep(for: .milliseconds(700))
            return TestHTTPResponse(text: "ok")
        }
        let client = HTTPClient(timeout: .seconds(2), maxConcurrentTransfers: 2)
        try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<6 { group.addTask { try await client.send("GET", "\(server.baseURL)/\(index)").status } }
            for try await status in group { #expect(status == 200) }
        }
        await server.stop()
    }

    @Test func aResponseLongerThanTheClientKeepsIsAnErrorNotACutDocument() async throws {
        let server = try await TestHTTPServer { _ in TestHTTPResponse(body: [UInt8](repeating: 32, count: 16 * 1024 * 1024 + 10)) }
        let client = HTTPClient()
        await #expect { _ = try await client.send("GET", "\(server.baseURL)/big") } throws: { error in
            (error as? HTTPClientError)?.kind == .transfer && "\(error)".contains("longer than")
        }
        await server.stop()
    }

    @Test func connectionErrorsAreTypedAndRetriable() async throws {
        let client = HTTPClient(connectTimeout: .seconds(2), timeout: .seconds(5))
        // Port 9 (discard) on loopback: nothing listens there in a test environment.
        await #expect { _ = try await client.send("GET", "http://127.0.0.1:9/") } throws: { error in
            (error as? HTTPClientError)?.kind == .connect && (error as? HTTPClientError)?.isRetriable == true
        }
    }
}
