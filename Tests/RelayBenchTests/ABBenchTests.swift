import Testing

@testable import revenue_relay_bench

/// `revenue-relay-bench ab`: what it reads of each e2e run, how it reports the pairs, and the runs it
/// refuses to start. Its figures decide which changes docs/benchmarks.md keeps.
@Suite struct ABBenchTests {
    /// A round line as e2e prints it today.
    static let current: Substring = """
        embedded round 1: 1911 notifications/s end to end (0.118 V), all recorded at 1749/s (0.108 V), 828 µs relay CPU per notification \
        (13.4 verifications), peak RSS 92 MiB, machine CPU 96% busy; at 500/s: p50 6.5 ms, p99 22 ms, max 34 ms, relay CPU 2266 µs per \
        notification (36.6 verifications)
        """

    @Test func itReadsEveryFigureOfARoundLine() throws {
        let round = try #require(ABBench.Round(line: Self.current))
        #expect(round.perSecond == 1911)
        #expect(round.inV == 0.118)
        #expect(round.cpuMicroseconds == 828, "the throughput run's CPU, not the latency run's")
        #expect(round.steadyCPUMicroseconds == 2266)
        #expect(round.p99 == 22)
        #expect(round.peakRSSMiB == 92)
        #expect(round.summary == "0.118 V end to end, 828 µs relay CPU, p99 22 ms")
    }

    @Test func itReadsTheRelaysFiguresFromE2ERoundLinesOnBothLogs() throws {
        var result = E2EBench.RoundResult(
            perSecond: 2077, settledPerSecond: 1890, cpuMicroseconds: 706, peakRSS: 111 << 20, machineBusy: 0.93, p50: 20, p99: 28, max: 33,
            steadyCPUMicroseconds: 1182, brokerCPUMicroseconds: 56, brokerPeakRSS: 119 << 20)
        // On Kafka the broker's figures come after the relay's: ab reads the relay's.
        let kafka = E2EBench.roundLine(kind: .kafka, round: 1, result: result, rate: 500, verifyRate: 24_000)
        #expect(kafka.hasSuffix("; the broker (its own process): 56 µs CPU per notification in the throughput run, its memory at most 119 MiB"))
        let round = try #require(ABBench.Round(line: Substring(kafka)))
        #expect(round.perSecond == 2077)
        #expect(round.inV == 0.087)
        #expect(round.cpuMicroseconds == 706)
        #expect(round.steadyCPUMicroseconds == 1182)
        #expect(round.p99 == 28)
        #expect(round.peakRSSMiB == 111, "the relay's peak, not the broker's")
        // The embedded log has no broker, and its line reads the same way.
        result.brokerCPUMicroseconds = nil
        result.brokerPeakRSS = nil
        let embedded = E2EBench.roundLine(kind: .embedded, round: 2, result: result, rate: 500, verifyRate: 24_000)
        #expect(!embedded.contains("broker"))
        #expect(try #require(ABBench.Round(line: Substring(embedded))).summary == "0.087 V end to end, 706 µs relay CPU, p99 28 ms")
    }

    @Test func itReadsTheLinesOfOlderBuildsWithoutWhatTheyDidNotPrint() throws {
        // 736bb79's line: before e2e measured V, and before the latency run's CPU (e2d6145).
        let old: Substring = """
            embedded round 2: 1109 notifications/s end to end, 1430 µs relay CPU per notification, peak RSS 110 MiB, machine CPU 95% busy; \
            at 740/s: p50 7.0 ms, p99 41 ms, max 61 ms
            """
        let round = try #require(ABBench.Round(line: old))
        #expect(round.perSecond == 1109)
        #expect(round.inV == nil)
        #expect(round.cpuMicroseconds == 1430)
        #expect(round.steadyCPUMicroseconds == nil)
        #expect(round.p99 == 41)
        #expect(round.peakRSSMiB == 110)
        #expect(round.summary == "1109/s end to end, 1430 µs relay CPU, p99 41 ms")
        // Under 10 ms e2e prints a decimal, and so does the summary.
        let fast = try #require(ABBench.Round(line: Substring(String(old).replacingOccurrences(of: "p99 41 ms", with: "p99 9.5 ms"))))
        #expect(fast.p99 == 9.5)
        #expect(fast.summary == "1109/s end to end, 1430 µs relay CPU, p99 9.5 ms")
    }

    @Test func itSkipsEveryOtherLineOfE2E() {
        for line: Substring in [
            "e2e: Apple notifications (Apple: 12764 bytes, three JWS), 5000 per throughput run, 64 connections; latency at 500/s for 10 s; 5 rounds; cores: 2",
            "V = 16148 ES256 verifications/s on one core (openssl speed ecdsap256); latency offered at 0.031 V",
            "| embedded (SQLite) | 1796 (1651–1966) | 1652 (1530–1795) | 5.8 / 21 / 32 (18–23) | 879 µs (828–968) | 2172 µs (2066–2266) | 90 MiB (88–92) | 96% (96–97) |",
            "embedded (SQLite): end to end 0.111 V (goal ≥ 0.12 V), all recorded 0.102 V; relay CPU 14.2 verifications per notification (goal ≤ 10)",
            // A round line cut short (a run that died mid-line) has no figures to trust.
            "embedded round 1: 1911 notifications/s end to end (0.118 V), all recorded at 1749/s (0.108 V), 828 µs relay CPU per",
        ] {
            #expect(ABBench.Round(line: line) == nil, "\(line)")
        }
    }

    @Test func theMedianOfAnOddAndAnEvenCount() {
        #expect(ABBench.median([3, 1, 2]) == 2)
        #expect(ABBench.median([4, 1, 3, 2]) == 2.5)
        #expect(ABBench.median([7]) == 7)
    }

    private static func round(v: Double?, perSecond: Double = 2000, cpu: Double, steady: Double? = 2000, p99: Double = 20, rss: Double = 95) throws
        -> ABBench.Round
    {
        let inV = v.map { " (\($0) V)" } ?? ""
        let latency = steady.map { ", relay CPU \(Int($0)) µs per notification" } ?? ""
        let line = """
            embedded round 1: \(Int(perSecond)) notifications/s end to end\(inV), \(Int(cpu)) µs relay CPU per notification, peak RSS \(Int(rss)) MiB; \
            at 500/s: p50 5 ms, p99 \(p99) ms, max 40 ms\(latency)
            """
        return try #require(ABBench.Round(line: Substring(line)))
    }

    private static func row(_ report: String, _ name: String) -> [String]? {
        report.split(separator: "\n").first { $0.hasPrefix("| \(name) |") }.map {
            $0.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
        }
    }

    @Test func theReportGivesMediansRangesAndWhichWayEachPairWent() throws {
        let a = [
            try Self.round(v: 0.110, cpu: 900, steady: 2100, p99: 22, rss: 95), try Self.round(v: 0.120, cpu: 800, steady: 2000, p99: 8.5, rss: 94),
            try Self.round(v: 0.100, cpu: 1000, steady: 2300, p99: 30, rss: 96),
        ]
        let b = [
            try Self.round(v: 0.115, cpu: 850, steady: 2000, p99: 20, rss: 101), try Self.round(v: 0.118, cpu: 800, steady: 2050, p99: 9.5, rss: 100),
            try Self.round(v: 0.110, cpu: 950, steady: 2100, p99: 40, rss: 96),
        ]
        let report = ABBench.report(a: a, b: b)
        // Higher is better for throughput, lower for the rest; a pair that did not move counts for neither
        // side and shows no sign.
        #expect(Self.row(report, "end to end") == ["end to end", "0.110 V (0.100 V–0.120 V)", "0.115 V (0.110 V–0.118 V)", "+0.005 V (−0.002 V–+0.010 V)", "2 of 3"])
        #expect(Self.row(report, "relay CPU per notification") == ["relay CPU per notification", "900 µs (800 µs–1000 µs)", "850 µs (800 µs–950 µs)", "−50 µs (−50 µs–0 µs)", "2 of 3"])
        #expect(Self.row(report, "relay CPU in the latency run") == ["relay CPU in the latency run", "2100 µs (2000 µs–2300 µs)", "2050 µs (2000 µs–2100 µs)", "−100 µs (−200 µs–+50 µs)", "2 of 3"])
        #expect(Self.row(report, "p99 in the latency run") == ["p99 in the latency run", "22 ms (8.5 ms–30 ms)", "20 ms (9.5 ms–40 ms)", "+1.0 ms (−2.0 ms–+10 ms)", "1 of 3"])
        #expect(Self.row(report, "peak RSS") == ["peak RSS", "95 MiB (94 MiB–96 MiB)", "100 MiB (96 MiB–101 MiB)", "+6 MiB (0 MiB–+6 MiB)", "0 of 3"])
    }

    @Test func anUnmovedPairCountsForNeitherSideWhereHigherIsBetterToo() throws {
        let a = [try Self.round(v: 0.110, cpu: 900), try Self.round(v: 0.120, cpu: 900)]
        let b = [try Self.round(v: 0.110, cpu: 900), try Self.round(v: 0.126, cpu: 900)]
        let report = ABBench.report(a: a, b: b)
        #expect(Self.row(report, "end to end") == ["end to end", "0.115 V (0.110 V–0.120 V)", "0.118 V (0.110 V–0.126 V)", "+0.003 V (0.000 V–+0.006 V)", "1 of 2"])
        #expect(Self.row(report, "relay CPU per notification")?.last == "0 of 2")
    }

    @Test func aSideFromAnOlderBuildIsReportedInWhatBothPrinted() throws {
        let a = [try Self.round(v: nil, perSecond: 1500, cpu: 900, steady: nil), try Self.round(v: nil, perSecond: 1700, cpu: 850, steady: nil)]
        let b = [try Self.round(v: 0.12, perSecond: 1900, cpu: 800), try Self.round(v: 0.11, perSecond: 1800, cpu: 820)]
        let report = ABBench.report(a: a, b: b)
        #expect(Self.row(report, "end to end") == ["end to end", "1600/s (1500/s–1700/s)", "1850/s (1800/s–1900/s)", "+250/s (+100/s–+400/s)", "2 of 2"])
        #expect(Self.row(report, "relay CPU in the latency run") == nil, "A's build did not measure it")
    }

    @Test func itRefusesRunsThatWouldNotCompareTwoThingsSayingWhy() {
        for (arguments, reason) in [
            ([], "A and B are the same"),  // this build against itself
            (["--env-a", "X=1", "--env-b", "X=1"], "A and B are the same"),
            (["--a", "/tmp/same", "--b", "/tmp/same"], "A and B are the same"),
            (["--b", "/tmp/other", "--pairs", "0"], "--pairs must be an even number, at least 2"),
            (["--b", "/tmp/other", "--pairs", "5"], "--pairs must be an even number, at least 2 (got 5)"),
            (["--env-b", "NO_EQUALS"], "take NAME=VALUE"),
            (["--env-b", "=1"], "take NAME=VALUE"),
            (["--b", "/tmp/other", "--", "--rounds", "3"], "leave out --rounds"),
            (["--b", "/tmp/other", "--", "--rounds=3"], "leave out --rounds"),
            (["--b", "/tmp/other", "--", "--log", "both"], "compare one log at a time"),
            (["--b", "/tmp/other", "--", "--log=both"], "compare one log at a time"),
        ] {
            #expect("\(arguments)") {
                _ = try ABBench.parse(arguments)
            } throws: { error in
                ABBench.message(for: error).contains(reason)
            }
        }
        #expect(throws: Never.self) { _ = try ABBench.parse(["--env-b", "GLIBC_TUNABLES=glibc.malloc.mxfast=0"]) }
        #expect(throws: Never.self) { _ = try ABBench.parse(["--a", "/tmp/one", "--b", "/tmp/one", "--env-b", "X=1"]) }
    }

    @Test func eachRunIsOneRoundOfOneLogWithTheDefaultsOrTheOptionsGiven() {
        #expect(
            ABBench.e2eRun([]) == ["e2e", "--log", "embedded", "--count", "20000", "--latency-seconds", "8", "--rate", "500", "--rounds", "1"])
        #expect(ABBench.e2eRun(["--count", "5000"]) == ["e2e", "--count", "5000", "--log", "embedded", "--rounds", "1"], "e2e's default is both logs")
        #expect(ABBench.e2eRun(["--log", "kafka", "--count", "5000"]) == ["e2e", "--log", "kafka", "--count", "5000", "--rounds", "1"])
        #expect(ABBench.e2eRun(["--log=kafka"]) == ["e2e", "--log=kafka", "--rounds", "1"])
    }

    @Test func pairsAlternateWhichSideGoesFirst() {
        #expect((0..<4).map(ABBench.order(ofPair:)) == [[0, 1], [1, 0], [0, 1], [1, 0]])
    }

    @Test func anEnvironmentSettingKeepsEverythingAfterItsFirstEqualsSign() {
        let environment = ABBench.environment(
            ["PATH": "/bin", "MALLOC_ARENA_MAX": "16"],
            adding: ["GLIBC_TUNABLES=glibc.malloc.mxfast=0:glibc.malloc.tcache_count=0", "MALLOC_ARENA_MAX=2", "EMPTY="])
        #expect(
            environment == [
                "PATH": "/bin", "MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "glibc.malloc.mxfast=0:glibc.malloc.tcache_count=0", "EMPTY": "",
            ])
    }

    @Test func itFindsEveryLogTheArgumentsName() {
        #expect(ABBench.logs(in: ["--log", "kafka", "--count", "5000"]) == ["kafka"])
        #expect(ABBench.logs(in: ["--log=both"]) == ["both"])
        #expect(ABBench.logs(in: ["--count", "5000"]) == [])
        #expect(ABBench.logs(in: ["--log"]) == [""], "a --log without a name is still one")
    }
}
