import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// Seeing and steering deliveries through a whole relay, on Kafka and on the embedded log: an endpoint that
/// fails, then recovers; its health; a resend; a time-range recover that re-sends each failure once; a 410
/// that disables it and an enable that reaches the deliverer through every partition; a read key that sees
/// but cannot act; and the same from the command line.
@Suite struct DeliveryActionsTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    static let readKey = "rk_demo_read_0001"

    enum Mode: Int { case failing = 0, ok = 1, gone = 2 }

    @Test(arguments: TestLog.allCases)
    func aFailingEndpointIsSeenResentRecoveredOnceDisabledByA410AndEnabled(_ log: TestLog) async throws {
        let mode = Atomic<Int>(Mode.failing.rawValue)
        let receiver = try await TestHTTPServer { _ in
            switch Mode(rawValue: mode.load(ordering: .relaxed)) {
            case .ok: TestHTTPResponse(status: 200)
            case .gone: TestHTTPResponse(status: 410)
            default: TestHTTPResponse(status: 500, text: "down for maintenance")
            }
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-actions"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func writeConfiguration(_ name: String, key: String) throws -> URL {
            let file = directory.appendingPathComponent(name)
            try StripeDemoConfiguration.write(
                to: file,
                backend: #"apiKey: "\#(key)", database: backend.sqlite, listen: "127.0.0.1:0", readKeys: [{ key: "\#(Self.readKey)", apps: [demo] }]"#,
                endpoints: [#"id: hooks, app: demo, url: "\#(receiver.baseURL)/hooks?token=not-shown", secrets: ["\#(Self.secret)"], events: ["*"]"#])
            return file
        }
        let file = try writeConfiguration("relay.yaml", key: "test-backend-key")
        let readFile = try writeConfiguration("read.yaml", key: Self.readKey)
        let relay = try await TestRelay(configuration: try RelayConfiguration.load(path: file.path, environment: [:]), log: log)
        let backendURL = await relay.environment.process.backendAddress.value()
        let started = Int64(Date().timeIntervalSince1970 * 1000)
        @Sendable func call(_ method: String, _ path: String, key: String = "test-backend-key") async throws -> (status: Int, json: JSON) {
            try await relay.backend("/subscriptions-api/internal/v1" + path, method: method, key: key)
        }
        @Sendable func hooks() async throws -> JSON { try await call("GET", "/endpoints").json["endpoints"]?.arrayValue?.first ?? .null }
        @Sendable func post(_ id: String, event: String) async throws {
            let body = StripeTestEvent.subscriptionCreated(subscription: id, event: event, user: "user-\(id)", start: started / 1000)
            #expect(try await relay.postStripe(body) == 200)
        }

        // Two events, each failing twice: dead-lettered. The endpoint's health says so.
        try await post("sub_a", event: "evt_a")
        let ids = ["stripe:evt_a:initial_purchase", "stripe:evt_a:subscription_status_did_change"]
        try await waitUntil("both dead in the endpoint's backlog") { try await hooks()["backlog"]?["dead"]?.int64Value == 2 }
        let health = try await hooks()
        #expect(receiver.requests.count == 4)
        #expect(health["host"] == "127.0.0.1", "the host only, never the URL's token")
        #expect(!health.text.contains("not-shown"))
        #expect(health["lastHour"]?["attempts"]?.int64Value == 4)
        #expect(health["lastHour"]?["successRate"]?.doubleValue == 0)
        #expect(health["lastDay"]?["p50Ms"]?.int64Value != nil)
        #expect(health["lastFailure"]?["error"] == "HTTP 500")
        #expect(health["lastFailure"]?["outcome"] == "dead")
        #expect(health["circuit"] == "closed" && health["disabled"] == false)

        // A read key sees, and cannot act.
        let dead = try #require(try await call("GET", "/deliveries?eventId=\(ids[0])&status=dead").json["deliveries"]?.arrayValue?.first)
        let attemptId = try #require(dead["id"]?.stringValue)
        let encodedId = try #require(attemptId.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
        #expect(try await call("GET", "/endpoints", key: Self.readKey).status == 200)
        #expect(try await call("POST", "/deliveries/\(encodedId)/resend", key: Self.readKey).status == 403)
        #expect(try await call("POST", "/endpoints/hooks/recover?since=\(started)", key: Self.readKey).status == 403)
        #expect(try await call("POST", "/endpoints/hooks/enable", key: Self.readKey).status == 403)
        #expect(try await call("POST", "/deliveries/nope/resend").status == 404)
        #expect(try await call("POST", "/endpoints/nope/recover?since=\(started)").status == 404)
        #expect(try await call("POST", "/endpoints/hooks/recover").status == 400)

        // The endpoint is fixed: one resend sends that event again, with its webhook-id.
        mode.store(Mode.ok.rawValue, ordering: .relaxed)
        let resent = try await call("POST", "/deliveries/\(encodedId)/resend")
        #expect(resent.status == 202, "\(resent.json)")
        try await waitUntil("the resend") { receiver.requests.count == 5 }
        #expect(receiver.requests.last?.headers["webhook-id"] == ids[0])
        #expect(StandardWebhooksReceiver.verify(try #require(receiver.requests.last), secret: Self.secret))
        try await waitUntil("the resend's attempt in the log") {
            try await call("GET", "/deliveries?eventId=\(ids[0])&status=succeeded").json["deliveries"]?.arrayValue?.first?["replayedFrom"]?.stringValue?
                .hasPrefix("resend:") == true
        }

        // Recover the range: only the event that has not succeeded since goes, once.
        let recovered = try await call("POST", "/endpoints/hooks/recover?since=\(started)")
        #expect(recovered.status == 202, "\(recovered.json)")
        #expect(recovered.json["resent"] == 1)
        let again = try await call("POST", "/endpoints/hooks/recover?since=\(started)")
        #expect(again.json["resent"] == 0, "\(again.json)")
        try await waitUntil("the recovered delivery") { receiver.requests.count == 6 }
        #expect(receiver.requests.last?.headers["webhook-id"] == ids[1])
        try await waitUntil("an empty backlog") { try await hooks()["backlog"]?["dead"]?.int64Value == 0 }
        #expect(try await call("POST", "/endpoints/hooks/recover?since=\(started)").json["resent"] == 0)
        try await Task.sleep(for: .milliseconds(300))
        #expect(receiver.requests.count == 6)

        // A 410 disables the endpoint: the next event is dead-lettered unsent, and the health says so.
        mode.store(Mode.gone.rawValue, ordering: .relaxed)
        try await post("sub_b", event: "evt_b")
        try await waitUntil("disabled by the 410") { try await hooks()["disabled"] == true }
        try await waitUntil("both of sub_b dead") {
            try await call("GET", "/deliveries?status=dead").json["deliveries"]?.arrayValue?.filter { $0["eventId"]?.stringValue?.hasPrefix("stripe:evt_b") == true }.count == 2
        }
        #expect(receiver.requests.count == 7, "one attempt got the 410; the other was not sent")

        // Enabled: the request reaches the deliverer (on every partition), and new events go out again.
        mode.store(Mode.ok.rawValue, ordering: .relaxed)
        let enabled = try await call("POST", "/endpoints/hooks/enable")
        #expect(enabled.status == 202, "\(enabled.json)")
        #expect((enabled.json["partitions"]?.int64Value ?? 0) >= 1)
        try await waitUntil("enabled") { try await hooks()["disabled"] == false }
        try await post("sub_c", event: "evt_c")
        try await waitUntil("sub_c delivered") { receiver.requests.count == 9 }
        #expect(Set(receiver.requests.suffix(2).compactMap { $0.headers["webhook-id"] }) == ["stripe:evt_c:initial_purchase", "stripe:evt_c:subscription_status_did_change"])

        // The command line: health, and a read key refused an action.
        let executable: URL = try #require(CommandLineTests.executable)
        let listed = try await runChildProcess(executable, ["endpoints", "--config", file.path, "--backend-url", backendURL])
        #expect(listed.status == 0, "\(listed.stderr)")
        #expect(listed.stdoutText.contains("hooks  app=demo  host=127.0.0.1"), "\(listed.stdoutText)")
        #expect(listed.stdoutText.contains("circuit=closed"), "\(listed.stdoutText)")
        let refused = try await runChildProcess(executable, ["deliveries", "resend", attemptId, "--config", readFile.path, "--backend-url", backendURL])
        #expect(refused.status == 78, "\(refused.stderr)")
        let recover = try await runChildProcess(
            executable, ["endpoints", "recover", "hooks", "--since", String(started), "--config", file.path, "--backend-url", backendURL])
        #expect(recover.status == 0, "\(recover.stderr)")
        // sub_b's two dead letters (the 410 and the one not sent) are re-sent, once.
        #expect(recover.stdoutText.contains("\"resent\":2"), "\(recover.stdoutText)")
        try await waitUntil("sub_b recovered") { receiver.requests.count == 11 }
        let resend = try await runChildProcess(executable, ["deliveries", "resend", attemptId, "--config", file.path, "--backend-url", backendURL])
        #expect(resend.status == 0, "\(resend.stderr)")
        try await waitUntil("the second resend") { receiver.requests.count == 12 }
        #expect(receiver.requests.last?.headers["webhook-id"] == ids[0])

        try await relay.stop()
        await receiver.stop()
    }
}
