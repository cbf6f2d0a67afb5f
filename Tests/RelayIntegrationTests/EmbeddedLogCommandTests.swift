import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
import Testing

/// The embedded log from the command line, while a `dev` process owns it: a second owner is refused at
/// once, `topics` and `tail` read it (the built binary, in child processes).
@Suite struct EmbeddedLogCommandTests {
    func run(_ arguments: [String]) async throws -> ChildProcessResult {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        return try await runChildProcess(executable, arguments)
    }

    @Test func aSecondOwnerFailsAtOnceAndToolsReadTheLogWhileItsOwnerRuns() async throws {
        let configuration = try TestRelay.configuration()
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let data = try #require(relay.dataDirectory)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay") + ".yaml")
        try Data("ingest: { listen: \"127.0.0.1:0\" }\nbackend: { apiKey: k, listen: \"127.0.0.1:0\" }\n".utf8).write(to: file)

        // A second dev on the same data directory exits at once, naming the directory (not a hang), also
        // when its ports are the same as the first's (the directory is what to fix).
        let sameConfig = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay") + ".yaml")
        try Data("ingest: { listen: \"\(relay.baseURL.replacingOccurrences(of: "http://", with: ""))\" }\nbackend: { apiKey: k }\n".utf8).write(to: sameConfig)
        let sameListen = try await run(["dev", "--config", sameConfig.path, "--data", data])
        #expect(sameListen.status == 69, "\(sameListen.stderr)")
        #expect(sameListen.stderr.contains("in use by another revenue-relay process"), "\(sameListen.stderr)")
        let second = try await run(["dev", "--config", file.path, "--data", data])
        #expect(second.status == 69)
        #expect(second.stderr.contains(data) && second.stderr.contains("in use by another revenue-relay process"), "\(second.stderr)")

        // A raw notification appended through the ingest, then read by the tools.
        let now = Int64(Date().timeIntervalSince1970)
        let body = #"{"id":"evt_tail_1","object":"event","type":"customer.created","created":\#(now),"data":{"object":{"id":"cus_tail"}}}"#
        let signature = WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status == 200)

        let tail = try await run(["tail", "relay.notifications", "--config", file.path, "--data", data, "--from-beginning", "--limit", "1"])
        #expect(tail.status == 0, "\(tail.stderr)")
        let line = try JSON.parse(Array(tail.stdoutText.split(separator: "\n").first.map(String.init)?.utf8 ?? "".utf8))
        #expect(line["topic"] == "relay.notifications")
        #expect(line["key"] == "stripe:evt_tail_1", "a customer event names no subscription or customer field: the event id")
        #expect(line["value"]?["id"] == "evt_tail_1", "the value as JSON")
        #expect(line["headers"]?["relay-store"] == "stripe")

        try await waitUntil("the worker to finish the notification") {
            let topics = try await run(["topics", "--config", file.path, "--data", data, "--json"])
            let report = try JSON.parse(Array(topics.stdoutText.utf8))
            let notifications = report["topics"]?.arrayValue?.first { $0["topic"] == "relay.notifications" }
            return notifications?["records"] == 1 && notifications?["groups"]?.arrayValue?.first?["lag"] == 0
        }
        #expect(try await run(["tail", "relay.nonexistent", "--config", file.path, "--data", data]).status == 69)
        let typo = try await run(["topics", "--config", file.path, "--data", data + "-typo"])
        #expect(typo.status == 69)
        #expect(typo.stderr.contains("there is no embedded log in \(data)-typo"), "\(typo.stderr)")
        #expect(!FileManager.default.fileExists(atPath: data + "-typo"), "a tool creates no log")
        #expect(try await run(["topics", "--config", file.path, "--data", data, "--bootstrap-servers", "x:1"]).status == 64)
        try await relay.stop()
    }
}
