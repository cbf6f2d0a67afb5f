import Foundation
import Glibc
import GRDB
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The NDJSON export holds one batch in memory, whatever the number of events: measured on a relay in
/// its own process (`dev`), so nothing else the tests do moves the figure.
@Suite struct EventsExportMemoryTests {
    @Test func anNDJSONExportOf100kEventsStreamsInBoundedMemory() async throws {
        let executable = try #require(CommandLineTests.executable)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("export"))
        // Its database is 150 MB: removed after the relay stopped (defers run last-declared first).
        defer { try? FileManager.default.removeItem(at: directory) }
        let data = directory.appendingPathComponent("data")
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)

        // 100,000 events in the events store's file before the relay starts, written by SQL (the test is
        // about reading them): one renewal's payload, each with its own id.
        let database = data.appendingPathComponent("backend.sqlite").path
        _ = try SubscriptionDatabase(path: database)  // creates the schema
        let template = #"{"applicationId":1,"data":{"id":"EVENT-ID","name":"renewal","padding":"\#(String(repeating: "x", count: 1_000))"},"object":"event","projectId":1,"timestamp":1767225600005,"type":"renewal"}"#
        // Waits out the lock the closing schema connections hold for a moment (the last one to close a WAL
        // database checkpoints it): without a busy timeout the open failed at once, in some runs every time.
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let queue = try DatabaseQueue(path: SubscriptionDatabase.eventsPath(forBackend: database), configuration: configuration)
        try await queue.write { db in
            try db.execute(
                sql: """
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
                    INSERT INTO event (id, app, project_id, application_id, type, store, environment, original_transaction_id,
                        app_user_id, product_id, ts, received_at, currency, price_usd, proceeds_usd, price_local, historical, payload)
                    SELECT 'apple:' || i || ':renewal', 'demo', 1, 1, 'renewal', 'apple', 'PRODUCTION', '1000', 'user-1',
                        'com.example.pro.monthly', 1767225600000 + i, 1767225600005 + i, 'USD', 9.99, 8.49, 9.99, 0,
                        replace(?, 'EVENT-ID', 'apple:' || i || ':renewal')
                    FROM n
                    """, arguments: [template])
        }
        try queue.close()
        let exported = template.utf8.count * 100_000
        // The test's premise, not the relay's behaviour: an export large enough that holding it whole shows.
        try #require(exported > 100_000_000, "the template must keep the export over 100 MB")

        // The dev configuration on free ports.
        let root = FileManager.default.currentDirectoryPath
        let config = try String(contentsOfFile: "config/dev.yaml", encoding: .utf8)
            .replacingOccurrences(of: "listen: \"127.0.0.1:8080\"", with: "listen: \"127.0.0.1:0\"")
            .replacingOccurrences(of: "listen: \"127.0.0.1:8081\"", with: "listen: \"127.0.0.1:0\"")
            .replacingOccurrences(of: ": dev/", with: ": \(root)/config/dev/")
            .replacingOccurrences(of: ", dev/", with: ", \(root)/config/dev/")
            .replacingOccurrences(of: "[certs/", with: "[\(root)/config/certs/")
        let file = directory.appendingPathComponent("relay.yaml")
        try Data(config.utf8).write(to: file)
        let relay = try startChildProcess(executable, ["dev", "--config", file.path, "--data", data.path])
        defer { relay.killIfRunning() }
        let line = try #require(await relay.line(startingWith: "backend: ", within: .seconds(60)), "dev did not start")
        let port = try #require(Int(line.split(separator: ":").last ?? ""))

        let before = try Self.memory(of: relay.pid, resetPeak: true).resident
        let connection = try RawConnection(port: port)
        try connection.send(
            "GET /subscriptions-api/internal/v1/events?app=demo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer dev-backend-key\r\n"
                + "Accept: application/x-ndjson\r\nConnection: close\r\n\r\n")
        let received = await connection.count("}\n", within: .seconds(300))
        let peak = try Self.memory(of: relay.pid, resetPeak: false).peak
        #expect(received.occurrences == 100_000)
        #expect(received.bytes > exported)
        // Held whole, the export alone would add over 100 MB; streamed, the relay grows by a few batches.
        #expect(peak - before < 48 << 20, "the relay's peak RSS grew by \((peak - before) >> 20) MiB during the export")

        relay.signal(SIGTERM)
        #expect(await relay.result().status == 0)
    }

    /// A process's resident set and its peak (Linux `/proc/PID/status`); with `resetPeak`, the peak is
    /// first reset to the resident set (`clear_refs`).
    static func memory(of pid: pid_t, resetPeak: Bool) throws -> (resident: Int, peak: Int) {
        if resetPeak { try "5".write(toFile: "/proc/\(pid)/clear_refs", atomically: false, encoding: .utf8) }
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        func field(_ name: String) throws -> Int {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }),
                let kilobytes = Int(line.split(separator: " ").dropFirst().first ?? "")
            else { throw CocoaError(.fileReadCorruptFile) }
            return kilobytes * 1024
        }
        return (try field("VmRSS"), try field("VmHWM"))
    }
}
