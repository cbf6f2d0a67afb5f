import Foundation
import Glibc
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Signature headers of the right shape (the ingest refuses requests without them; the worker verifies them).
let stripeSigned = [("Stripe-Signature", "t=1700000000,v1=00")]
let paddleSigned = [("Paddle-Signature", "ts=1700000000;h1=00")]

func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// The ingest routes of docs/contracts.md (ingest and the raw record) over real HTTP on 127.0.0.1: the
/// exact record each store's request becomes, and what is refused before the log. The log here is the
/// in-memory one (the record is the same on any log); the ingest on Kafka, with its brokers down, is in
/// RelayIntegrationTests.
@Suite struct IngestRoutes {
    /// The ingest server with app `demo` receiving every store and `stripe-only`, and its log's records.
    struct Relay {
        let server: IngestServer
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))
        var baseURL: String { "http://127.0.0.1:\(server.port)" }

        func post(_ path: String, body: String, headers: [(String, String)] = []) async throws -> HTTPClientResponse {
            try await http.send("POST", baseURL + path, headers: [("Content-Type", "application/json")] + headers, body: Array(body.utf8))
        }

        /// Every record the ingest wrote, in order.
        func records() async throws -> [ConsumedRecord] {
            var records: [ConsumedRecord] = []
            for try await record in try server.log.snapshot(of: "relay.notifications").records { records.append(record) }
            return records
        }
    }

    static func server(ingest: String = "") async throws -> Relay {
        let apps = """
            [{ key: demo, projectId: 1, applicationId: 1,
               apple: { bundleId: com.example.app, environments: [Sandbox], rootCertificates: ["\(Fixtures.path("apple/root.pem"))"] },
               google: { packageName: com.example.app, pushAudience: "https://relay.test/google", pushServiceAccount: "push@example.iam.gserviceaccount.com", jwks: "\(Fixtures.path("google/jwks.json"))" },
               stripe: { signingSecrets: ["whsec_test"] }, paddle: { secretKeys: ["pdl_test"] } },
             { key: stripe-only, projectId: 1, applicationId: 2, stripe: { signingSecrets: ["whsec_test"] } }]
            """
        return Relay(server: try await IngestServer(ingest: ingest, apps: apps))
    }

    struct Case: Sendable, CustomStringConvertible {
        var store: String
        var body: String
        var headers: [(String, String)]
        var expectedKey: String
        var description: String { store }
    }

    static var cases: [Case] {
        let transaction = "\(base64URL(#"{"alg":"ES256"}"#)).\(base64URL(#"{"originalTransactionId":"2000000123","transactionId":"2000000999"}"#)).c2ln"
        let payload = base64URL(#"{"notificationType":"DID_RENEW","notificationUUID":"6a8f-uuid","data":{"signedTransactionInfo":"\#(transaction)"}}"#)
        let developerNotification = Data(#"{"version":"1.0","packageName":"com.example.app","subscriptionNotification":{"notificationType":4,"purchaseToken":"token-abc","subscriptionId":"pro"}}"#.utf8).base64EncodedString()
        return [
            Case(store: "apple", body: #"{"signedPayload":"\#(base64URL(#"{"alg":"ES256","x5c":["MIIB","MIIC"]}"#)).\#(payload).c2ln"}"#, headers: [], expectedKey: "apple:2000000123"),
            Case(
                store: "google", body: #"{"message":{"data":"\#(developerNotification)","messageId":"136969346945"},"subscription":"projects/p/subscriptions/s"}"#,
                headers: [("Authorization", "Bearer eyJ.test.jwt")], expectedKey: "google:token-abc"),
            Case(
                store: "stripe", body: #"{"id":"evt_1","type":"invoice.paid","data":{"object":{"object":"invoice","customer":"cus_9","parent":{"subscription_details":{"subscription":"sub_42"}}}}}"#,
                headers: [("Stripe-Signature", "t=1700000000,v1=abc,v1=def")], expectedKey: "stripe:sub_42"),
            Case(
                store: "paddle", body: #"{"event_id":"evt_01","event_type":"transaction.completed","data":{"id":"txn_1","subscription_id":"sub_01h","customer_id":"ctm_1"}}"#,
                headers: [("Paddle-Signature", "ts=1700000000;h1=abc")], expectedKey: "paddle:sub_01h"),
        ]
    }

    @Test(arguments: cases)
    func acceptedNotificationIsTheExactRecordInTheLog(_ testCase: Case) async throws {
        let relay = try await IngestRoutes.server()
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        let response = try await relay.post("/v1/notifications/\(testCase.store)/demo", body: testCase.body, headers: testCase.headers)
        let after = Int64(Date().timeIntervalSince1970 * 1000)
        #expect(response.status == 200)

        let record = try #require(try await relay.records().first)
        #expect(record.keyString == testCase.expectedKey)
        #expect(record.value == Array(testCase.body.utf8))
        #expect(record.headers.first(named: "relay-store")?.stringValue == testCase.store)
        #expect(record.headers.first(named: "relay-app")?.stringValue == "demo")
        let receivedAt = try #require(record.headers.first(named: "relay-received-at")?.stringValue.flatMap { Int64($0) })
        #expect((before...after).contains(receivedAt))
        for (name, value) in testCase.headers {
            #expect(record.headers.first(named: name.lowercased())?.stringValue == value)
        }
        // Only the documented headers: nothing else from the request leaks into the record.
        #expect(Set(record.headers.map(\.name)).isSubset(of: ["relay-store", "relay-app", "relay-received-at", "stripe-signature", "paddle-signature", "authorization"]))
        try await relay.server.stop()
    }

    @Test func aBodyTheIngestCannotDecodeIsRefusedNotStoredUndecoded() async throws {
        let relay = try await IngestRoutes.server()
        // Raw HTTP/1.1 over a socket: the client library would not send a gzip transfer coding.
        func exchange(_ request: String) throws -> String {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(Int(String(relay.server.port))!).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            try #require(connected == 0, "connect: errno \(errno)")
            var timeout = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &buffer, buffer.count, 0)
            return String(decoding: buffer.prefix(max(0, count)), as: UTF8.self)
        }
        let body = #"{"id":"evt_gz"}"#
        let chunk = String(body.utf8.count, radix: 16) + "\r\n" + body + "\r\n0\r\n\r\n"
        let gzip = try exchange(
            "POST /v1/notifications/stripe/stripe-only HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n" + chunk)
        #expect(gzip.hasPrefix("HTTP/1.1 501"), "\(gzip)")
        #expect(gzip.contains("unsupported_transfer_encoding"))
        // Plain chunked is fine.
        let chunked = try exchange(
            "POST /v1/notifications/stripe/stripe-only HTTP/1.1\r\nHost: relay\r\nStripe-Signature: t=1700000000,v1=00\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunk)
        #expect(chunked.hasPrefix("HTTP/1.1 200"), "\(chunked)")
        let records = try await relay.records()
        #expect(records.map(\.keyString) == ["stripe:evt_gz"])
        try await relay.server.stop()
    }

    @Test func aKnownRouteWithTheWrongMethodAnswers405WithAllow() async throws {
        let relay = try await IngestRoutes.server()
        for method in ["GET", "PUT", "DELETE"] {
            let response = try await relay.http.send(method, relay.baseURL + "/v1/notifications/stripe/demo")
            #expect(response.status == 405, "\(method)")
            #expect(response.header("allow") == "POST")
            #expect(response.bodyText.contains("method_not_allowed"))
        }
        let post = try await relay.http.send("POST", relay.baseURL + "/health/ready", body: Array("{}".utf8))
        #expect(post.status == 405)
        #expect(post.header("allow") == "GET")
        // No route at all stays 404.
        #expect(try await relay.http.send("GET", relay.baseURL + "/v2/nothing").status == 404)
        #expect(try await relay.http.send("POST", relay.baseURL + "/v1/notifications/stripe").status == 404)
        try await relay.server.stop()
    }

    @Test func rejectsUnknownAppsOversizeBodiesAndNonJSON() async throws {
        let relay = try await IngestRoutes.server(ingest: "maxBodyBytes: 1024")
        #expect(try await relay.post("/v1/notifications/stripe/nope", body: "{}", headers: stripeSigned).status == 404)
        // The app exists but does not receive Apple notifications.
        #expect(try await relay.post("/v1/notifications/apple/stripe-only", body: "{}").status == 404)
        #expect(try await relay.post("/v1/notifications/amazon/demo", body: "{}").status == 404)
        let large = #"{"pad":""# + String(repeating: "x", count: 2000) + #""}"#
        let tooLarge = try await relay.post("/v1/notifications/stripe/demo", body: large, headers: stripeSigned)
        #expect(tooLarge.status == 413)
        #expect(tooLarge.bodyText.contains("too_large"))
        let notJSON = try await relay.post("/v1/notifications/stripe/demo", body: "id=evt_1&type=x", headers: stripeSigned)
        #expect(notJSON.status == 400)
        #expect(notJSON.bodyText.contains("not_json"))
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: "", headers: stripeSigned).status == 400)
        // Valid JSON with a number no Double holds is still JSON: taken, never 400 (a store resends a
        // 400ed body for days). The worker judges it.
        #expect(try await relay.post("/v1/notifications/stripe/stripe-only", body: #"{"id":"evt_big","n":1e999999}"#, headers: stripeSigned).status == 200)
        // Nothing refused above reached the log; the valid ones do (on their partitions).
        #expect(try await relay.post("/v1/notifications/stripe/stripe-only", body: #"{"id":"evt_ok"}"#, headers: stripeSigned).status == 200)
        let records = try await relay.records()
        #expect(records.count == 2)
        #expect(Set(records.compactMap(\.keyString)) == ["stripe:evt_big", "stripe:evt_ok"])
        try await relay.server.stop()
    }
}
