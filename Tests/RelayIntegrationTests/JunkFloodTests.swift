import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayEmbeddedLog
import RelayHTTPClient
import RelayTestSupport
import Testing

/// The attack of the ingest's issue, against a whole relay: only the ingest runs (no worker) on an
/// embedded log with a 1 MiB `retentionBytes`; real Apple notifications arrive, then 8 MB of junk
/// shaped like them. The junk is refused once the budget is full (503, `Retry-After`), retention keeps
/// every real notification, a body that is not a JWS is refused with 400 and never written, and once a
/// worker has caught up the ingest answers 200 again.
@Suite struct JunkFloodTests {
    static let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))

    func start(_ configuration: RelayConfiguration, roles: [Role]) async throws -> (RelayProcess, Task<Void, any Error>, String) {
        let process = try RelayProcess(configuration: configuration, roles: roles, logger: testLogger("relay"), installSignalHandlers: false)
        let task = Task { try await process.run() }
        return (process, task, "http://127.0.0.1:\(await process.waitForHTTPPort())")
    }

    func post(_ base: String, _ body: String) async throws -> HTTPClientResponse {
        try await Self.http.send("POST", base + "/v1/notifications/apple/demo", headers: [("Content-Type", "application/json")], body: Array(body.utf8))
    }

    /// A signed SUBSCRIBED notification of its own subscription.
    func real(_ index: Int) -> String {
        let signer = AppleSigner()
        var payload = signer.notificationPayload(transaction: AppleSigner.transaction(originalTransactionId: "20000000000000\(10 + index)"))
        if case .object(var members) = payload {
            members["notificationUUID"] = .string("real-\(index)")
            payload = .object(members)
        }
        return String(decoding: signer.body(payload), as: UTF8.self)
    }

    /// 100 kB shaped like an Apple notification (an ES256 header with an x5c chain), signed by no one.
    func junk(_ index: Int) -> String {
        let header = Base64.encodeURL(Array(#"{"alg":"ES256","x5c":["MIIBjunk"]}"#.utf8))
        let payload = Base64.encodeURL((0..<75_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) })
        return #"{"signedPayload":"\#(header).\#(payload).c2lnbmF0dXJl"}"#
    }

    @Test func realNotificationsSurviveAJunkFloodWithOnlyTheIngestRunning() async throws {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("junk-flood")).path
        let configuration = try AppleRelayConfiguration.parse(
            AppleRelayConfiguration.text(sections: "log: { kind: embedded, path: \"\(data)\", partitions: 1, retentionBytes: 1048576 }\n"),
            name: "junk-flood")
        let topic = configuration.topics.notifications

        var (process, task, base) = try await start(configuration, roles: [.ingest])
        for index in 0..<10 { #expect(try await post(base, real(index)).status == 200) }
        var accepted = 0
        var full: HTTPClientResponse?
        for index in 0..<80 {
            let response = try await post(base, junk(index))
            if response.status == 200 { accepted += 1 } else { full = response }
        }
        let refusal = try #require(full, "8 MB of junk was all accepted into a 1 MiB budget")
        #expect(refusal.status == 503)
        #expect(refusal.header("retry-after") == "30")
        #expect(refusal.bodyText.contains("log_full"), "\(refusal.bodyText)")
        #expect(accepted < 12, "the budget stopped the flood (\(accepted) accepted)")
        // Still ready (the process serves the rest), with the reason as a warning.
        let ready = try await Self.http.send("GET", base + "/health/ready")
        #expect(ready.status == 200)
        #expect(try JSON.parse(ready.body)["warnings"] == ["log_budget_full"], "\(ready.bodyText)")

        let log = try #require(process.log as? EmbeddedRecordLog)
        let written = try log.partitionEnds(of: topic)[0].endOffset
        let notJWS = try await post(base, #"{"signedPayload":"not a JWS at all"}"#)
        #expect(notJWS.status == 400)
        #expect(try log.partitionEnds(of: topic)[0].endOffset == written, "a body that is not a JWS is not written")

        // A retention pass, an hour from now: nothing unprocessed goes.
        log.runHousekeeping(retention: configuration.log.retention, retentionBytes: configuration.log.retentionBytes, now: wallClockMilliseconds() + 3_600_000)
        var uuids: [String] = []
        for try await record in try log.snapshot(of: topic).records {
            let body = try JSON.parse(record.value)
            if let payload = body["signedPayload"]?.stringValue.flatMap(JWSPayload.decode), let uuid = payload["notificationUUID"]?.stringValue {
                uuids.append(uuid)
            }
        }
        #expect(uuids == (0..<10).map { "real-\($0)" }, "every real notification is still in the log")
        await process.triggerGracefulShutdown()
        try await task.value

        // The worker runs again and catches up: the junk goes to the rejected topic, the budget has room, and
        // the stores' retries are taken.
        (process, task, base) = try await start(configuration, roles: [.ingest, .worker, .backend])
        let url = base
        try await waitUntil("the ingest takes notifications again") { try await post(url, real(10)).status == 200 }
        let reopened = try #require(process.log as? EmbeddedRecordLog)
        try await waitUntil("the worker processed everything") {
            let end = try reopened.partitionEnds(of: topic)[0].endOffset
            return try reopened.committedOffsets(group: "relay-worker", topic: topic)[0] == end
        }
        let rejected = try reopened.partitionEnds(of: configuration.topics.rejected).reduce(0) { $0 + $1.endOffset }
        #expect(rejected == Int64(accepted), "the junk that was written was rejected by verification, not lost")
        let readyAgain = try await Self.http.send("GET", base + "/health/ready")
        #expect(readyAgain.status == 200)
        #expect(try JSON.parse(readyAgain.body)["warnings"] == nil)
        await process.triggerGracefulShutdown()
        try await task.value
    }
}
