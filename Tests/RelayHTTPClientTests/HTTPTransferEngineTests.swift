import Foundation
import RelayHTTPClient
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
        await engine.close()

        var guarded = HTTPTransferEngine.Configuration()
        guarded.addressCheck = { $0 == "127.0.0.1" ? "loopback" : nil }
        let guardedEngine = try HTTPTransferEngine(configuration: guarded)
        let refused = await guardedEngine.send(HTTPTransferRequest(url: server.baseURL, headers: [], body: [], timeout: .seconds(5)))
        #expect(refused.error?.kind == .addressRefused)
        #expect(refused.error?.message == "refused to connect to 127.0.0.1: loopback")
        #expect(server.requests.count == 1)
        await guardedEngine.close()
        await server.stop()
    }
}
