import Foundation
import RelayTestSupport
import Testing

/// Clients that open connections and hold them: idle, half-sent or trickling. Before these limits, about
/// 1,100 such connections used up the descriptors and the health routes stopped answering.
@Suite struct ConnectionLimitTests {
    @Test func idleAndHalfSentConnectionsAreClosedAndHealthStillAnswers() async throws {
        let server = try await IngestServer(ingest: "idleTimeout: 300ms, maxConnections: 4")
        let port = server.port
        // Four connections that send nothing fill the cap.
        let silent = try (0..<4).map { _ in try RawConnection(port: port) }
        // The health route still answers: the silent ones are closed after idleTimeout, freeing the slots.
        let probe = try RawConnection(port: port)
        try probe.send("GET /health/live HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
        let answer = await probe.receive(until: "live", within: .seconds(20))
        #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        for connection in silent {
            #expect(await connection.closedByPeer(within: .seconds(20)))
        }
        // Headers begun and never finished.
        let halfSent = try RawConnection(port: port)
        try halfSent.send("POST /v1/notifications/stripe/demo HTTP/1.1\r\nHost: relay\r\n")
        #expect(await halfSent.closedByPeer(within: .seconds(20)))
        // Kept alive after a response, then idle.
        let keptAlive = try RawConnection(port: port)
        try keptAlive.send("GET /health/ready HTTP/1.1\r\nHost: relay\r\n\r\n")
        let ready = await keptAlive.receive(until: "}", within: .seconds(20))
        #expect(ready.hasPrefix("HTTP/1.1 "), "\(ready)")
        #expect(await keptAlive.closedByPeer(within: .seconds(20)))
        try await server.stop()
    }

    @Test func aRequestWhoseBodyNeverArrivesIsClosedAtRequestTimeout() async throws {
        // The idle timeout is far away: only the request deadline can close this connection.
        let server = try await IngestServer(ingest: "idleTimeout: 10m, requestTimeout: 300ms")
        let connection = try RawConnection(port: server.port)
        try connection.send(
            "POST /v1/notifications/stripe/demo HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
        #expect(await connection.closedByPeer(within: .seconds(20)))
        // A whole request on a new connection is unaffected.
        let next = try RawConnection(port: server.port)
        try next.send("GET /health/live HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
        #expect(await next.receive(until: "live", within: .seconds(20)).hasPrefix("HTTP/1.1 200"))
        try await server.stop()
    }

    @Test func atTheCapANewConnectionWaitsUntilOneCloses() async throws {
        let server = try await IngestServer(ingest: "idleTimeout: 10m, maxConnections: 3")
        let port = server.port
        // Three kept-alive connections, each answered once so the server has surely counted it.
        var held: [RawConnection] = []
        for _ in 0..<3 {
            let connection = try RawConnection(port: port)
            try connection.send("GET /health/live HTTP/1.1\r\nHost: relay\r\n\r\n")
            let answer = await connection.receive(until: "live", within: .seconds(20))
            try #require(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
            held.append(connection)
        }
        let waiting = try RawConnection(port: port)
        try waiting.send("GET /health/live HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
        // Not accepted while the cap is reached (the kernel's backlog holds it).
        #expect(await waiting.receive(until: "live", within: .milliseconds(500)) == "")
        held.removeFirst()
        let answer = await waiting.receive(until: "live", within: .seconds(20))
        #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        held.removeAll()
        try await server.stop()
    }
}
