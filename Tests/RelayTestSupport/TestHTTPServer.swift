import RelayCrypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import RelayVerification
import ServiceLifecycle

/// One request a `TestHTTPServer` received.
public struct TestHTTPRequest: Sendable {
    public var method: String
    public var path: String
    /// Lower-case names.
    public var headers: [String: String]
    public var body: [UInt8]
}

/// What a `TestHTTPServer` answers.
public struct TestHTTPResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int = 200, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    public init(status: Int = 200, headers: [(String, String)] = [], text: String) {
        self.init(status: status, headers: headers, body: Array(text.utf8))
    }
}

/// A real HTTP/1.1 server on 127.0.0.1 with an ephemeral port, answering every request with
/// `handler`, recording what it received. Stands in for Google's key endpoint, receivers and backends.
public final class TestHTTPServer: Sendable {
    public let port: Int
    public var baseURL: String { "http://127.0.0.1:\(port)" }
    private let group: ServiceGroup
    private let task: Task<Void, any Error>
    private let received: LockedBox<[TestHTTPRequest]>

    public var requests: [TestHTTPRequest] { received.value }

    public init(handler: @escaping @Sendable (TestHTTPRequest) async -> TestHTTPResponse) async throws {
        let received = LockedBox<[TestHTTPRequest]>([])
        let portBox = AsyncStream.makeStream(of: Int.self)
        let responder = CallbackResponder<BasicRequestContext> { request, _ in
            let body = try await request.body.collect(upTo: 16 << 20)
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            let recorded = TestHTTPRequest(
                method: request.method.rawValue, path: request.uri.description, headers: headers, body: Array(body.readableBytesView))
            received.withLock { $0.append(recorded) }
            let answer = await handler(recorded)
            var fields = HTTPFields()
            for (name, value) in answer.headers {
                if let name = HTTPField.Name(name) { fields.append(HTTPField(name: name, value: value)) }
            }
            return Response(
                status: HTTPResponse.Status(code: answer.status), headers: fields,
                body: ResponseBody(byteBuffer: ByteBuffer(bytes: answer.body)))
        }
        var logger = Logger(label: "test-http-server")
        logger.logLevel = .critical
        let application = Application(
            responder: responder, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: nil),
            onServerRunning: { channel in portBox.continuation.yield(channel.localAddress?.port ?? 0) }, logger: logger)
        let group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: logger)
        self.group = group
        self.received = received
        self.task = Task { try await group.run() }
        var iterator = portBox.stream.makeAsyncIterator()
        guard let port = await iterator.next() else { throw TestTimeout(what: "test HTTP server start") }
        self.port = port
    }

    public func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

/// Verifies a webhook as the `standardwebhooks` and `svix` libraries do: `v1,` signatures over
/// `id.timestamp.body` with the base64 key after `whsec_`, any one of several matching, the timestamp
/// within five minutes. Written from their specification, independently of `WebhookSigner`.
public enum StandardWebhooksReceiver {
    public static func verify(_ request: TestHTTPRequest, secret: String, prefix: String = "webhook") -> Bool {
        guard let id = request.headers["\(prefix)-id"], let timestamp = request.headers["\(prefix)-timestamp"],
            let signatures = request.headers["\(prefix)-signature"], let seconds = Int64(timestamp),
            abs(Int64(Date().timeIntervalSince1970) - seconds) <= 300,
            let key = Data(base64Encoded: String(secret.dropFirst("whsec_".count)))
        else { return false }
        let expected = Digest.hmacSHA256(key: Array(key), message: Array("\(id).\(timestamp).".utf8) + request.body).map { Data($0).base64EncodedString() }
        return signatures.split(separator: " ").contains { candidate in
            let parts = candidate.split(separator: ",", maxSplits: 1)
            return parts.count == 2 && parts[0] == "v1" && String(parts[1]) == expected
        }
    }
}

