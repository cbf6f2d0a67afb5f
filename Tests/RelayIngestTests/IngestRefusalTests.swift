import Foundation
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Synchronization
import Testing

/// What the ingest refuses before anything is written, over real HTTP on 127.0.0.1: requests no store
/// sends, clients over their limits, sources outside the allowed ranges. The client's address comes
/// from `X-Forwarded-For` only when the TCP peer is a trusted proxy.
@Suite struct IngestRefusalTests {
    static let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))
    static let apps = #"[{ key: demo, projectId: 1, applicationId: 1, apple: { bundleId: com.example.app, environments: [Sandbox], rootCertificates: ["\#(Fixtures.path("apple/root.pem"))"] }, stripe: { signingSecrets: ["whsec_test"] } }]"#
    static let stripeSignature = ("Stripe-Signature", "t=1700000000,v1=00")

    /// A monotonic clock the test steps.
    final class TestClock: Sendable {
        private let nanoseconds = Atomic<UInt64>(1_000_000_000)
        func advance(_ duration: Duration) { nanoseconds.add(UInt64(duration.components.seconds) * 1_000_000_000, ordering: .relaxed) }
        var now: @Sendable () -> UInt64 { { self.nanoseconds.load(ordering: .relaxed) } }
    }

    func post(
        _ server: IngestServer, _ store: String = "stripe", body: String = #"{"id":"evt_1"}"#, headers: [(String, String)] = [stripeSignature]
    ) async throws -> HTTPClientResponse {
        try await Self.http.send(
            "POST", "http://127.0.0.1:\(server.port)/v1/notifications/\(store)/demo", headers: [("Content-Type", "application/json")] + headers,
            body: Array(body.utf8))
    }

    func written(_ server: IngestServer) throws -> Int64 {
        try server.log.partitionEnds(of: "relay.notifications").reduce(0) { $0 + $1.endOffset }
    }

    func metrics(_ server: IngestServer) -> String {
        var buffer: [UInt8] = []
        server.registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }

    @Test func aBodyThatIsNotANotificationGets400AndIsNotWritten() async throws {
        let server = try await IngestServer(apps: Self.apps)
        let junk = try await post(server, "apple", body: #"{"signedPayload":"this is not a JWS"}"#, headers: [])
        #expect(junk.status == 400)
        #expect(junk.bodyText.contains("not_a_notification") && junk.bodyText.contains("compact JWS"), "\(junk.bodyText)")
        let unsigned = try await post(server, "stripe", headers: [])
        #expect(unsigned.status == 400)
        #expect(unsigned.bodyText.contains("Stripe-Signature"), "\(unsigned.bodyText)")
        #expect(try written(server) == 0, "nothing refused was written")

        let real = String(decoding: AppleSigner().body(AppleSigner().notificationPayload()), as: UTF8.self)
        #expect(try await post(server, "apple", body: real, headers: []).status == 200)
        #expect(try await post(server).status == 200)
        #expect(try written(server) == 2)
        let text = metrics(server)
        #expect(text.contains(#"relay_ingest_refused_total{store="apple",reason="not_a_notification"} 1"#), "\(text)")
        #expect(text.contains(#"relay_ingest_refused_total{store="stripe",reason="not_a_notification"} 1"#))
        try await server.stop()
    }

    @Test func aClientOverItsRequestRateGets429WithRetryAfterUntilItsBucketRefills() async throws {
        let clock = TestClock()
        let server = try await IngestServer(ingest: "clientLimit: { requestsPerSecond: 1, burst: 2 }", clock: clock.now)
        #expect(try await post(server).status == 200)
        #expect(try await post(server).status == 200)
        let limited = try await post(server)
        #expect(limited.status == 429)
        #expect(limited.header("retry-after") == "1")
        #expect(limited.bodyText.contains("rate_limited"))
        // Junk counts too: the limit comes before the body is read.
        #expect(try await post(server, body: "not json").status == 429)
        clock.advance(.seconds(1))
        #expect(try await post(server).status == 200)
        #expect(try await post(server).status == 429)
        #expect(try written(server) == 3)
        #expect(metrics(server).contains(#"relay_ingest_refused_total{store="stripe",reason="rate_limited"} 3"#))
        try await server.stop()
    }

    @Test func forwardedForIsBelievedOnlyFromTrustedProxies() async throws {
        let clock = TestClock()
        // The peer (127.0.0.1) is not a trusted proxy: whatever it claims, it is one client.
        let untrusted = try await IngestServer(
            ingest: #"trustedProxies: ["10.0.0.0/8"], clientLimit: { requestsPerSecond: 1, burst: 2 }"#, clock: clock.now)
        #expect(try await post(untrusted, headers: [Self.stripeSignature, ("X-Forwarded-For", "198.51.100.1")]).status == 200)
        #expect(try await post(untrusted, headers: [Self.stripeSignature, ("X-Forwarded-For", "198.51.100.2")]).status == 200)
        #expect(try await post(untrusted, headers: [Self.stripeSignature, ("X-Forwarded-For", "198.51.100.3")]).status == 429, "a spoofed header buys no new bucket")
        try await untrusted.stop()

        // Behind a trusted proxy, the address it recorded is the client.
        let proxied = try await IngestServer(
            ingest: #"trustedProxies: ["127.0.0.1/32", "10.0.0.0/8"], clientLimit: { requestsPerSecond: 1, burst: 2 }"#, clock: clock.now)
        for address in ["198.51.100.1", "198.51.100.2", "198.51.100.3", "2001:db8:1:2::1"] {
            #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", address)]).status == 200, "\(address)")
        }
        // One client through two proxies; and one that writes its own entry in front: the proxy's entry counts.
        let client = "203.0.113.7"
        #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", client)]).status == 200)
        #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", "\(client), 10.1.1.1")]).status == 200)
        #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", "192.0.2.99, \(client)")]).status == 429)
        // An IPv6 client's /64 is one client.
        #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", "2001:db8:1:2::2")]).status == 200)
        #expect(try await post(proxied, headers: [Self.stripeSignature, ("X-Forwarded-For", "2001:db8:1:2:ffff::3")]).status == 429)
        try await proxied.stop()
    }

    @Test func allowedSourcesRefuseEveryOtherAddressOfThatStoreOnly() async throws {
        let clock = TestClock()
        let server = try await IngestServer(
            ingest: #"trustedProxies: ["127.0.0.1/32"], allowedSources: { stripe: ["17.0.0.0/8", "2001:db8::/32"] }, clientLimit: { requestsPerSecond: 1, burst: 1, unverifiedBytes: 65536 }"#,
            apps: Self.apps, clock: clock.now)
        let direct = try await post(server)
        #expect(direct.status == 403)
        #expect(direct.bodyText.contains("source_not_allowed") && direct.bodyText.contains("ingest.allowedSources.stripe"))
        #expect(try await post(server, headers: [Self.stripeSignature, ("X-Forwarded-For", "17.1.2.3")]).status == 200)
        #expect(try await post(server, headers: [Self.stripeSignature, ("X-Forwarded-For", "2001:db8:5::1")]).status == 200)
        // The rightmost untrusted entry is the client, not one the client wrote in front.
        #expect(try await post(server, headers: [Self.stripeSignature, ("X-Forwarded-For", "17.1.2.3, 192.0.2.1")]).status == 403)
        #expect(try await post(server, headers: [Self.stripeSignature, ("X-Forwarded-For", "18.0.0.1")]).status == 403)
        // A listed source is the store: the per-client limits do not apply to it (the clock stands still).
        let big = #"{"id":"evt_big","pad":""# + String(repeating: "x", count: 40_000) + #""}"#
        for _ in 0..<3 {
            #expect(try await post(server, body: big, headers: [Self.stripeSignature, ("X-Forwarded-For", "17.1.2.3")]).status == 200)
        }
        // Apple has no list here: any source, and the limits apply (burst 1).
        let real = String(decoding: AppleSigner().body(AppleSigner().notificationPayload()), as: UTF8.self)
        #expect(try await post(server, "apple", body: real, headers: []).status == 200)
        #expect(try await post(server, "apple", body: real, headers: []).status == 429)
        #expect(try written(server) == 6)
        try await server.stop()
    }

    @Test func aClientsBytesNotYetProcessedAreBoundedAndFreedAsTheWorkerProcessesThem() async throws {
        let server = try await IngestServer(ingest: #"trustedProxies: ["127.0.0.1/32"], clientLimit: { unverifiedBytes: 65536 }"#)
        let body = #"{"id":"evt_big","pad":""# + String(repeating: "x", count: 20_000) + #""}"#
        let flooder = [Self.stripeSignature, ("X-Forwarded-For", "198.51.100.66")]
        // 0, 20, 40 and 60 kB outstanding are under 64 KiB; at 80 kB the client must wait.
        for index in 0..<4 { #expect(try await post(server, body: body, headers: flooder).status == 200, "\(index)") }
        let refused = try await post(server, body: body, headers: flooder)
        #expect(refused.status == 429)
        #expect(refused.bodyText.contains("too_much_unverified"), "\(refused.bodyText)")
        #expect(refused.header("retry-after") == "10")
        // Another client is not held back by it.
        #expect(try await post(server, body: body, headers: [Self.stripeSignature, ("X-Forwarded-For", "198.51.100.67")]).status == 200)
        #expect(try written(server) == 5)

        // The worker's group processes everything: the flooder may send again.
        let consumer = try server.log.consumer(ConsumerOptions(groupID: "relay-worker", topics: ["relay.notifications"]))
        let collector = RecordCollector(consumer.records)
        for record in try await collector.waitFor(count: 5) { consumer.markDone(record) }
        try await waitUntil("the flooder's bytes released") { try await post(server, body: body, headers: flooder).status == 200 }
        await consumer.close()
        try await server.stop()
    }

    @Test func aBoundTheIngestCannotReleaseIsDroppedRatherThanRefusingForever() async throws {
        struct NoPermission: Error {}
        let reads = Atomic<Int>(0)
        // Reading the worker's progress fails (a Kafka principal without access to the group's offsets).
        let server = try await IngestServer(
            ingest: #"clientLimit: { unverifiedBytes: 65536 }"#,
            processedOffsets: {
                reads.add(1, ordering: .sequentiallyConsistent)
                throw NoPermission()
            })
        let body = #"{"id":"evt_big","pad":""# + String(repeating: "x", count: 20_000) + #""}"#
        // 0, 20, 40 and 60 kB outstanding are under the bound; past half of it the worker's progress is read.
        for index in 0..<4 { #expect(try await post(server, body: body).status == 200, "\(index)") }
        try await waitUntil("the worker's progress read") { reads.load(ordering: .sequentiallyConsistent) > 0 }
        try await waitUntil("the failed read handled") { try await post(server, body: body).status == 200 }
        // The read failed, so the bound is dropped (said once in the log) instead of refusing this client until
        // the stores give up: 200 kB more, three times the bound, is all taken.
        for index in 0..<10 {
            let response = try await post(server, body: body)
            #expect(response.status == 200, "\(index): \(response.bodyText)")
        }
        #expect(try written(server) == 15)
        try await server.stop()
    }
}
