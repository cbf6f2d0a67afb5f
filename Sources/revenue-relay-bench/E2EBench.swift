import RelayCrypto
import ArgumentParser
import Foundation
import Glibc
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayVerification
import Synchronization

/// The wall clock in Unix nanoseconds; the receiver (another process) stamps arrivals with the same clock.
func wallClockNanoseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
}

/// The whole pipeline from outside, as an operator would measure it: `revenue-relay dev` (ingest, record
/// log, worker, local backend, deliverer in one process, here the bench's `e2e-relay` child running the
/// same code) on the embedded log or on the Kafka-protocol broker of `dev --kafka` (in a child of its own,
/// as a deployment's Kafka is in its own process: the relay's CPU and memory are its own), a webhook receiver
/// in another child, and this process posting signed notifications to the ingest.
///
/// Per round, with a fresh relay: a warm-up that also learns how many webhooks each kind of notification
/// causes; the throughput run (`--count` distinct notifications, `--connections` at once, first POST to
/// last webhook); the latency run (`--rate` notifications/s offered for `--latency-seconds`, POST to the
/// notification's first webhook). The relay's CPU time per notification and peak RSS come from /proc.
struct E2EBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "e2e", abstract: "End-to-end notifications/s, POST→webhook latency, CPU and memory of the whole pipeline.")

    enum LogKind: String, ExpressibleByArgument, CaseIterable {
        case embedded, kafka, both
    }

    @Option(help: "The record log: embedded, kafka (the in-memory Kafka-protocol broker of `dev --kafka`, in a process of its own) or both.")
    var log: LogKind = .both

    @Option(help: "Notifications in the throughput run.")
    var count = 5000

    @Option(help: "Concurrent POSTs in the throughput run.")
    var connections = 64

    @Option(help: "Notifications per second offered in the latency run.")
    var rate = 500

    @Option(help: "Seconds of the latency run.")
    var latencySeconds = 10

    @Option(help: "Rounds per log, each with a fresh relay; the median is reported with the range.")
    var rounds = 5

    @Flag(help: "Apple, Stripe and Paddle notifications in turn, instead of Apple only.")
    var mixed = false

    @Option(help: "The fixtures directory (Tests/Fixtures).")
    var fixtures = "Tests/Fixtures"

    @Option(
        help: """
            Apple notifications renew this many subscriptions in turn instead of each starting its own. Each round first \
            sends 16 renewals of each (unmeasured), so every state carries the 16 remembered notifications a long-lived \
            subscription's does. At least twice --connections.
            """)
    var subscriptions: Int?

    @Option(help: "The relay's worker.maxInFlight (default: the relay's own).")
    var workerInFlight: Int?

    @Flag(help: "Run the relay with apps[].apple.verifyNestedSignatures: false (the notification's signature vouches for its nested JWSs).")
    var nestedCovered = false

    @Option(
        help: """
            Rounds start with this many notifications' worth already recorded in the events store (each a \
            renewal and a status change, and a delivery attempt of each, its ids, user and subscription random), \
            written once before the rounds through the store's own code and copied into each round's backend \
            (about 7 KB a notification on disk, for the copy kept and each round's). \
            With 0, each starts with an empty store.
            """)
    var recorded = 0

    @Option(help: "Where the relay's data directories go (a fresh folder per round).")
    var directory = FileManager.default.temporaryDirectory.path

    @Option(
        help: """
            Writes the last latency run (the last round of the last --log) to this file, one line per notification in \
            POST order: its POST (ms after the run's first), POST→webhook (ms) and POST→the ingest's answer (ms); a header gives the first POST on \
            CLOCK_REALTIME and that clock less CLOCK_MONOTONIC (perf's). To see whether a tail is spikes or spread, and \
            which stage held them.
            """)
    var latencyFile: String?

    func run() async throws {
        let fixtures = URL(fileURLWithPath: self.fixtures).standardizedFileURL.path
        // Fewer, and two renewals of one subscription could be in flight together and arrive out of order.
        if let subscriptions, subscriptions < 2 * connections {
            throw ValidationError("--subscriptions must be at least twice --connections (\(2 * connections))")
        }
        guard recorded >= 0 else { throw ValidationError("--recorded must be 0 or more") }
        let factory = try NotificationFactory(fixtures: fixtures, mixed: mixed, subscriptions: subscriptions)
        let logs: [LogKind] = log == .both ? [.embedded, .kafka] : [log]
        let receiver = try ReceiverProcess(delayMilliseconds: 0)
        defer { receiver.stop() }
        let arrivals = ArrivalTracker(port: receiver.port)
        let engine = try HTTPTransferEngine(configuration: { var c = HTTPTransferEngine.Configuration(); c.maxConnectionsPerHost = connections; return c }())
        let sample = factory.make(index: 0, kind: 0)
        // V, measured now on the idle machine: the goals are stated against it (docs/benchmarks.md).
        let verifyRate = opensslVerifyRate(seconds: 3)
        note(
            "e2e: \(mixed ? "Apple, Stripe and Paddle" : "Apple") notifications (Apple: \(sample.body.count) bytes, three JWS)\(subscriptions.map { ", renewing \($0) subscriptions" } ?? ""), \(count) per throughput run, \(connections) connections; latency at \(rate)/s for \(latencySeconds) s; \(rounds) rounds; cores: \(ProcessInfo.processInfo.activeProcessorCount)"
        )
        if let verifyRate {
            note("V = \(Int(verifyRate)) ES256 verifications/s on one core (openssl speed ecdsap256); latency offered at \(String(format: "%.3f", Double(rate) / verifyRate)) V")
        }
        var history: RecordedHistory?
        if recorded > 0 {
            let started = ContinuousClock.now
            let built = try await RecordedHistory.build(notifications: recorded, directory: directory)
            history = built
            note(
                "recorded history: \(recorded) notifications' events and attempts, \(built.bytes / 1_048_576) MiB, written in \(ContinuousClock.now - started)"
            )
        }
        defer { history?.remove() }
        var summaries: [(LogKind, [RoundResult])] = []
        var nextIndex = 1
        for kind in logs {
            var results: [RoundResult] = []
            for round in 1...max(1, rounds) {
                let relay = try RelayChild(
                    kind: kind,
                    configuration: factory.configuration(receiverPort: receiver.port, fixtures: fixtures, workerInFlight: workerInFlight, nestedCovered: nestedCovered),
                    directory: directory, history: history)
                defer { relay.stop() }
                var measurement = Round(
                    ingest: relay.ingest, engine: engine, arrivals: arrivals, factory: factory, connections: connections)
                if let subscriptions {
                    // Every subscription renewed 16 times: its state at the worker's limit of remembered notifications.
                    let fill = (0..<(subscriptions * 16)).map { factory.make(index: nextIndex + $0, kind: 0) }
                    _ = try await measurement.settle(fill, concurrency: connections, what: "filling the subscriptions", relay: relay)
                    nextIndex += fill.count
                    // The webhooks are out, but the events store still records the fill: measured from idle, not
                    // with that backlog in the throughput run's CPU.
                    try await relay.waitUntilIdle()
                }
                // Warm-up: connections open, the product table cached, and webhooks per kind learned.
                let perKind = try await measurement.warmUp(startIndex: nextIndex, relay: relay)
                nextIndex += 1000
                let throughput = try await measurement.throughput(startIndex: nextIndex, count: count, perKind: perKind, relay: relay)
                nextIndex += count
                let latency = try await measurement.latency(startIndex: nextIndex, rate: rate, seconds: latencySeconds, relay: relay, file: latencyFile)
                nextIndex += rate * latencySeconds
                let result = RoundResult(
                    perSecond: throughput.perSecond, settledPerSecond: throughput.settledPerSecond, cpuMicroseconds: throughput.cpuMicroseconds, peakRSS: throughput.peakRSS,
                    machineBusy: throughput.machineBusy, p50: latency.p50, p99: latency.p99, max: latency.max,
                    steadyCPUMicroseconds: latency.cpuMicroseconds, brokerCPUMicroseconds: throughput.brokerCPUMicroseconds,
                    brokerPeakRSS: throughput.brokerPeakRSS)
                results.append(result)
                print(Self.roundLine(kind: kind, round: round, result: result, rate: rate, verifyRate: verifyRate))
                relay.stop()
                relay.removeFiles()
            }
            summaries.append((kind, results))
        }
        await engine.close()

        print("")
        var goals: [String] = []
        var notes: [String] = []
        print(
            "| log | notifications/s end to end | all recorded | p50 / p99 / max at \(rate)/s (ms) | relay CPU per notification | relay CPU at \(rate)/s | relay peak RSS | machine CPU busy |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (kind, results) in summaries {
            func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
            func range(_ values: [Double], _ format: (Double) -> String) -> String {
                values.count > 1 ? " (\(format(values.min()!))–\(format(values.max()!)))" : ""
            }
            let rates = results.map(\.perSecond)
            let settled = results.map(\.settledPerSecond)
            let p50 = results.map(\.p50)
            let p99 = results.map(\.p99)
            let max = results.map(\.max)
            let cpu = results.map(\.cpuMicroseconds)
            let steadyCPU = results.map(\.steadyCPUMicroseconds)
            let rss = results.map { Double($0.peakRSS) / 1_048_576 }
            let busy = results.map { $0.machineBusy * 100 }
            let name = kind == .embedded ? "embedded (SQLite)" : "Kafka protocol (mock cluster)"
            if let verifyRate {
                goals.append(
                    "\(name): end to end \(String(format: "%.3f", median(rates) / verifyRate)) V (goal ≥ 0.12 V), all recorded \(String(format: "%.3f", median(settled) / verifyRate)) V; relay CPU \(String(format: "%.1f", median(cpu) * verifyRate / 1_000_000)) verifications per notification (goal ≤ 10), \(String(format: "%.1f", median(steadyCPU) * verifyRate / 1_000_000)) at \(rate)/s; p99 \(fmt(median(p99))) ms at \(String(format: "%.3f", Double(rate) / verifyRate)) V offered (goal < 50 ms at 0.03 V); peak RSS \(Int(median(rss))) MiB (goal < 100)"
                )
            }
            let brokerCPU = results.compactMap(\.brokerCPUMicroseconds)
            let brokerRSS = results.compactMap { $0.brokerPeakRSS.map { Double($0) / 1_048_576 } }
            if !brokerCPU.isEmpty, !brokerRSS.isEmpty {
                notes.append(
                    "\(name): the broker, in its own process, not in the relay's figures: \(Int(median(brokerCPU))) µs CPU per notification in the throughput run\(range(brokerCPU) { "\(Int($0))" }), its memory at most \(Int(median(brokerRSS))) MiB\(range(brokerRSS) { "\(Int($0))" })"
                )
            }
            print(
                "| \(name) | \(Int(median(rates)))\(range(rates) { "\(Int($0))" }) | \(Int(median(settled)))\(range(settled) { "\(Int($0))" }) | \(fmt(median(p50))) / \(fmt(median(p99))) / \(fmt(median(max)))\(range(p99) { fmt($0) }) | \(Int(median(cpu))) µs\(range(cpu) { "\(Int($0))" }) | \(Int(median(steadyCPU))) µs\(range(steadyCPU) { "\(Int($0))" }) | \(Int(median(rss))) MiB\(range(rss) { "\(Int($0))" }) | \(Int(median(busy)))%\(range(busy) { "\(Int($0))" }) |"
            )
        }
        if !goals.isEmpty || !notes.isEmpty {
            print("")
            for line in goals + notes { print(line) }
        }
    }

    /// A round's line, as `ab` reads it (`ABBench.Round`). On `kafka` the broker's figures come last, after
    /// the relay's, and name no figure `ab` reads.
    static func roundLine(kind: LogKind, round: Int, result: RoundResult, rate: Int, verifyRate: Double?) -> String {
        let inV = verifyRate.map { String(format: " (%.3f V)", result.perSecond / $0) } ?? ""
        let settledInV = verifyRate.map { String(format: " (%.3f V)", result.settledPerSecond / $0) } ?? ""
        let inVerifications = verifyRate.map { String(format: " (%.1f verifications)", result.cpuMicroseconds * $0 / 1_000_000) } ?? ""
        let steadyInVerifications = verifyRate.map { String(format: " (%.1f verifications)", result.steadyCPUMicroseconds * $0 / 1_000_000) } ?? ""
        var broker = ""
        if let cpu = result.brokerCPUMicroseconds, let rss = result.brokerPeakRSS {
            broker = "; the broker (its own process): \(Int(cpu)) µs CPU per notification in the throughput run, its memory at most \(rss / 1_048_576) MiB"
        }
        return
            "\(kind.rawValue) round \(round): \(Int(result.perSecond)) notifications/s end to end\(inV), all recorded at \(Int(result.settledPerSecond))/s\(settledInV), \(Int(result.cpuMicroseconds)) µs relay CPU per notification\(inVerifications), peak RSS \(result.peakRSS / 1_048_576) MiB, machine CPU \(Int(result.machineBusy * 100))% busy; at \(rate)/s: p50 \(format(result.p50)) ms, p99 \(format(result.p99)) ms, max \(format(result.max)) ms, relay CPU \(Int(result.steadyCPUMicroseconds)) µs per notification\(steadyInVerifications)\(broker)"
    }

    func fmt(_ milliseconds: Double) -> String { Self.format(milliseconds) }

    static func format(_ milliseconds: Double) -> String { String(format: milliseconds < 10 ? "%.1f" : "%.0f", milliseconds) }

    struct RoundResult {
        var perSecond: Double
        /// Until the relay was idle again: the events store and the delivery log done recording too.
        var settledPerSecond: Double
        var cpuMicroseconds: Double
        var peakRSS: Int
        /// The machine's CPU busy during the throughput run (all processes, all cores), 0–1.
        var machineBusy: Double
        var p50: Double
        var p99: Double
        var max: Double
        /// The relay's CPU per notification in the latency run (a steady rate below saturation), until idle.
        var steadyCPUMicroseconds: Double
        /// On `kafka`, the broker's (its own process) CPU per notification in the throughput run, and its peak RSS.
        var brokerCPUMicroseconds: Double?
        var brokerPeakRSS: Int?
    }
}

/// The machine's CPU time so far from /proc/stat: (busy, all) in clock ticks, over every core.
func machineCPUTicks() -> (busy: Double, total: Double) {
    guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8), let line = stat.split(separator: "\n").first else { return (0, 0) }
    // cpu user nice system idle iowait irq softirq steal ...
    let values = line.split(separator: " ").dropFirst().compactMap { Double($0) }
    guard values.count >= 5 else { return (0, 0) }
    let total = values.prefix(8).reduce(0, +)
    return (total - values[3] - values[4], total)
}

/// One relay's measurements.
struct Round {
    let ingest: String
    let engine: HTTPTransferEngine
    let arrivals: ArrivalTracker
    let factory: NotificationFactory
    let connections: Int

    /// Posts a few notifications of each kind, waits for their webhooks, and returns webhooks per notification of each kind.
    mutating func warmUp(startIndex: Int, relay: RelayChild) async throws -> [Int] {
        let notifications = (0..<(20 * factory.kinds)).map { offset in factory.make(index: startIndex + offset, kind: offset % factory.kinds) }
        let expected = Dictionary(uniqueKeysWithValues: notifications.map { ($0.key, $0.kind) })  // notification key → kind
        let counts = try await settle(notifications, concurrency: 8, what: "warm-up", relay: relay)
        var perKind = [Int](repeating: 0, count: factory.kinds)
        for (key, count) in counts {
            let kind = expected[key]!
            if perKind[kind] == 0 { perKind[kind] = count }
            guard perKind[kind] == count else { throw ValidationError("warm-up: notifications of one kind caused \(perKind[kind]) and \(count) webhooks") }
        }
        return perKind
    }

    /// Posts `notifications` and waits for their webhooks; returns each one's count of webhooks.
    mutating func settle(
        _ notifications: [NotificationFactory.Notification], concurrency: Int, what: String, relay: RelayChild
    ) async throws -> [String: Int] {
        let expected = Set(notifications.map(\.key))
        try await post(notifications, concurrency: concurrency)
        // Every notification has its webhooks once no more arrive for a second after each had its first.
        var counts: [String: Int] = [:]
        var quietSince = ContinuousClock.now
        let deadline = ContinuousClock.now + .seconds(60)
        while true {
            let new = try await arrivals.poll()
            for arrival in new where expected.contains(arrival.key) { counts[arrival.key, default: 0] += 1 }
            if !new.isEmpty { quietSince = .now }
            if counts.count == expected.count, ContinuousClock.now - quietSince > .seconds(1) { break }
            guard ContinuousClock.now < deadline else {
                let missing = expected.filter { counts[$0] == nil }.prefix(3)
                throw ValidationError("\(what): no webhook for \(expected.count - counts.count) notifications (e.g. \(Array(missing))); the relay's log: \(relay.logPath)")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        return counts
    }

    /// `count` notifications, `connections` at once: first POST to last webhook (`perSecond`), and first POST
    /// to the relay idle again, everything recorded (`settledPerSecond`); the relay's CPU until it is idle.
    mutating func throughput(
        startIndex: Int, count: Int, perKind: [Int], relay: RelayChild
    ) async throws -> (
        perSecond: Double, settledPerSecond: Double, cpuMicroseconds: Double, peakRSS: Int, machineBusy: Double, brokerCPUMicroseconds: Double?,
        brokerPeakRSS: Int?
    ) {
        let notifications = (0..<count).map { factory.make(index: startIndex + $0, kind: $0 % factory.kinds) }
        let keys = Set(notifications.map(\.key))
        let expectedWebhooks = notifications.reduce(0) { $0 + perKind[$1.kind] }
        let cpuBefore = relay.cpuSeconds()
        let brokerCPUBefore = relay.broker?.cpuSeconds()
        let machineBefore = machineCPUTicks()
        let start = wallClockNanoseconds()
        let posting = Task { [self] in try await post(notifications, concurrency: connections) }
        var received = 0
        var last: Int64 = 0
        var lastProgress = ContinuousClock.now
        while received < expectedWebhooks {
            let new = try await arrivals.poll()
            for arrival in new where keys.contains(arrival.key) {
                received += 1
                last = max(last, arrival.nanoseconds)
            }
            if !new.isEmpty { lastProgress = .now }
            guard ContinuousClock.now - lastProgress < .seconds(60) else {
                throw ValidationError("throughput: \(received) of \(expectedWebhooks) webhooks, none for 60 s; the relay's log: \(relay.logPath)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        try await posting.value
        let machineAfter = machineCPUTicks()
        // The webhooks are out; the events store and the delivery log may still be recording them. Their
        // CPU is the notifications' too, and the latency run starts from an idle relay, not on that backlog.
        let settled = try await relay.waitUntilIdle()
        let cpu = relay.cpuSeconds() - cpuBefore
        let brokerCPU = brokerCPUBefore.flatMap { before in relay.broker.map { $0.cpuSeconds() - before } }
        let seconds = Double(last - start) / 1e9
        let busy = (machineAfter.busy - machineBefore.busy) / max(1, machineAfter.total - machineBefore.total)
        return (
            Double(count) / seconds, Double(count) / (Double(max(settled, last) - start) / 1e9), cpu / Double(count) * 1e6, relay.peakRSS(), busy,
            brokerCPU.map { $0 / Double(count) * 1e6 }, relay.broker?.peakRSS()
        )
    }

    /// `rate` notifications per second for `seconds`, each POST at its time (open loop): POST → first webhook, in
    /// ms; and the relay's CPU per notification from the first POST until it is idle again, everything recorded.
    /// At a steady rate below saturation every round batches alike, so this CPU varies less between rounds
    /// than the throughput run's, whose batches follow its backlog.
    mutating func latency(
        startIndex: Int, rate: Int, seconds: Int, relay: RelayChild, file: String? = nil
    ) async throws -> (p50: Double, p99: Double, max: Double, cpuMicroseconds: Double) {
        let total = rate * seconds
        let cpuBefore = relay.cpuSeconds()
        let notifications = (0..<total).map { factory.make(index: startIndex + $0, kind: $0 % factory.kinds) }
        let posted = PostTimes()
        let clock = ContinuousClock()
        let begin = clock.now
        let (engine, ingest) = (self.engine, self.ingest)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, notification) in notifications.enumerated() {
                try await clock.sleep(until: begin + .nanoseconds(Int64(index) * 1_000_000_000 / Int64(rate)))
                group.addTask {
                    posted.times.withLock { $0[notification.key] = wallClockNanoseconds() }
                    try await Self.post(notification, to: ingest, engine: engine)
                    posted.answered.withLock { $0[notification.key] = wallClockNanoseconds() }
                }
            }
            try await group.waitForAll()
        }
        var first: [String: Int64] = [:]
        var lastProgress = ContinuousClock.now
        let sent = posted.times.withLock { $0 }
        while first.count < total {
            let new = try await arrivals.poll()
            for arrival in new where sent[arrival.key] != nil && first[arrival.key] == nil { first[arrival.key] = arrival.nanoseconds }
            if !new.isEmpty { lastProgress = .now }
            guard ContinuousClock.now - lastProgress < .seconds(60) else {
                throw ValidationError("latency: \(first.count) of \(total) notifications had a webhook, none for 60 s; the relay's log: \(relay.logPath)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        _ = try await relay.waitUntilIdle()
        let cpu = (relay.cpuSeconds() - cpuBefore) / Double(total) * 1e6
        if let file {
            let start = sent.values.min() ?? 0
            let answered = posted.answered.withLock { $0 }
            var rows: [(posted: Int64, webhook: Int64, answer: Int64)] = []
            for (key, webhook) in first { rows.append((sent[key]!, webhook, answered[key] ?? 0)) }
            rows.sort { $0.posted < $1.posted }
            let lines = rows.map { row -> String in
                let at = Double(row.posted - start) / 1e6
                return String(format: "%.1f %.2f %.2f", at, Double(row.webhook - row.posted) / 1e6, Double(row.answer - row.posted) / 1e6)
            }
            var monotonic = timespec()
            clock_gettime(CLOCK_MONOTONIC, &monotonic)
            // perf's default clock is CLOCK_MONOTONIC: its timestamps less this offset are the lines' clock.
            let offset = wallClockNanoseconds() - (Int64(monotonic.tv_sec) * 1_000_000_000 + Int64(monotonic.tv_nsec))
            try ("# start \(start) ns (CLOCK_REALTIME), realtime - monotonic \(offset) ns\n" + lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        }
        let latencies = first.map { Double($0.value - sent[$0.key]!) / 1e6 }.sorted()
        return (latencies[latencies.count / 2], latencies[min(latencies.count - 1, latencies.count * 99 / 100)], latencies.last!, cpu)
    }

    func post(_ notifications: [NotificationFactory.Notification], concurrency: Int) async throws {
        let (engine, ingest) = (self.engine, self.ingest)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, notification) in notifications.enumerated() {
                if index >= concurrency { try await group.next() }
                group.addTask { try await Self.post(notification, to: ingest, engine: engine) }
            }
            try await group.waitForAll()
        }
    }

    static func post(_ notification: NotificationFactory.Notification, to ingest: String, engine: HTTPTransferEngine) async throws {
        let result = await engine.send(
            HTTPTransferRequest(
                url: "\(ingest)/v1/notifications/\(notification.store)/bench", headers: notification.headers, body: notification.body,
                timeout: .seconds(30)))
        guard let response = result.response, response.status == 200 else {
            throw ValidationError("the ingest answered \(result.response.map { "HTTP \($0.status): \($0.bodyText)" } ?? "\(String(describing: result.error))")")
        }
    }
}

final class PostTimes: Sendable {
    let times = Mutex<[String: Int64]>([:])
    /// When the ingest answered each POST (its record durable in the log).
    let answered = Mutex<[String: Int64]>([:])
}

/// Reads the receiver's arrivals incrementally (GET /arrivals?from=N).
final class ArrivalTracker: Sendable {
    struct Arrival {
        /// `store:notificationId`: the webhook id without its event type.
        var key: String
        var nanoseconds: Int64
    }

    private let client = HTTPClient(maxConcurrentTransfers: 1)
    private let port: Int
    private let seen = Mutex(0)

    init(port: Int) { self.port = port }

    func poll() async throws -> [Arrival] {
        let from = seen.withLock { $0 }
        let response = try await client.send("GET", "http://127.0.0.1:\(port)/arrivals?from=\(from)")
        let arrivals = response.bodyText.split(separator: "\n").compactMap { line -> Arrival? in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let nanoseconds = Int64(parts[1]), let cut = parts[0].lastIndex(of: ":") else { return nil }
            return Arrival(key: String(parts[0][..<cut]), nanoseconds: nanoseconds)
        }
        seen.withLock { $0 += arrivals.count }
        return arrivals
    }
}
