import ArgumentParser
import Foundation

/// Two builds (or one build in two environments) compared the way docs/benchmarks.md compares them:
/// single-round `e2e` runs, alternated in pairs, A then B and then B then A, so that the VM's drift
/// falls on both alike. It reports each side's medians with their ranges, and the medians of the pairs'
/// differences, with how many pairs went each way.
///
/// On the shared VM these figures come from, runs of one build differ by up to a quarter, so a change
/// worth a few percent needs many pairs; the pairs' differences say whether it held in most of them.
struct ABBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ab",
        abstract: "Alternating single-round e2e runs of two builds (or two environments); medians and the pairs' differences.",
        discussion: """
            Arguments after `--` replace the default options of each `e2e` run (--log embedded --count 20000 \
            --latency-seconds 8 --rate 500); `--rounds 1` is always added, and `--log embedded` when no log is named. \
            --env-a and --env-b apply to the whole run: the relay, the load generator, the receiver and the measure of V. \
            The figures are read from e2e's round line, so either build may be older than this command (back to \
            e2d6145, whose line first had the latency run's CPU). Examples: `revenue-relay-bench ab --b /tmp/bench-old`, \
            or one build in two environments: `revenue-relay-bench ab --env-b GLIBC_TUNABLES=glibc.malloc.mxfast=0`.
            """)

    @Option(help: "Build A's revenue-relay-bench (default: this one).")
    var a: String?

    @Option(help: "Build B's revenue-relay-bench (default: this one).")
    var b: String?

    @Option(name: .customLong("env-a"), help: "NAME=VALUE added to build A's environment (repeatable).")
    var environmentA: [String] = []

    @Option(name: .customLong("env-b"), help: "NAME=VALUE added to build B's environment (repeatable).")
    var environmentB: [String] = []

    @Option(help: "Pairs of runs, an even number: each side goes first equally often.")
    var pairs = 6

    @Argument(parsing: .postTerminator, help: "Options for each e2e run.")
    var e2eArguments: [String] = []

    func validate() throws {
        // Odd, one side would go first once more often, and the VM's drift within a pair would favour it.
        guard pairs >= 2, pairs % 2 == 0 else { throw ValidationError("--pairs must be an even number, at least 2 (got \(pairs))") }
        for setting in environmentA + environmentB where !setting.contains("=") || setting.hasPrefix("=") {
            throw ValidationError("--env-a and --env-b take NAME=VALUE, not \(setting)")
        }
        if a == b, environmentA == environmentB {
            throw ValidationError("A and B are the same: give --a or --b another build, or --env-a / --env-b")
        }
        if e2eArguments.contains(where: { $0 == "--rounds" || $0.hasPrefix("--rounds=") }) {
            throw ValidationError("each run is one round: leave out --rounds")
        }
        if Self.logs(in: e2eArguments).contains("both") {
            throw ValidationError("compare one log at a time: --log embedded or --log kafka")
        }
    }

    func run() throws {
        let this = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let sides = [
            Side(name: "A", executable: a ?? this, environment: environmentA),
            Side(name: "B", executable: b ?? this, environment: environmentB),
        ]
        for side in sides where !FileManager.default.isExecutableFile(atPath: side.executable) {
            throw ValidationError("\(side.name): \(side.executable) is not an executable")
        }
        let arguments = Self.e2eRun(e2eArguments)
        note("ab: \(pairs) pairs of `\(arguments.joined(separator: " "))`")
        for side in sides { note("\(side.name): \(side.executable)\(side.environment.isEmpty ? "" : " with \(side.environment.joined(separator: " "))")") }
        var results: [[Round]] = [[], []]
        for pair in 0..<pairs {
            for index in Self.order(ofPair: pair) {
                do {
                    let round = try run(sides[index], arguments)
                    note("pair \(pair + 1) \(sides[index].name): \(round.summary)")
                    results[index].append(round)
                } catch {
                    // The pairs done so far are still worth reading.
                    let done = min(results[0].count, results[1].count)
                    if done > 0 { print(Self.report(a: Array(results[0].prefix(done)), b: Array(results[1].prefix(done)))) }
                    throw error
                }
            }
        }
        print(Self.report(a: results[0], b: results[1]))
    }

    static let defaultArguments = ["--log", "embedded", "--count", "20000", "--latency-seconds", "8", "--rate", "500"]

    /// The command line of each run: the given e2e options (or the defaults), the embedded log when they
    /// name none (e2e's own default is both logs; a pair compares one), and always one round.
    static func e2eRun(_ given: [String]) -> [String] {
        var options = given.isEmpty ? defaultArguments : given
        if logs(in: options).isEmpty { options += ["--log", "embedded"] }
        return ["e2e"] + options + ["--rounds", "1"]
    }

    /// Which side runs first in pair `pair` (0: A, 1: B): A then B, then B then A, so that drift within a
    /// pair falls on each side in turn.
    static func order(ofPair pair: Int) -> [Int] {
        pair % 2 == 0 ? [0, 1] : [1, 0]
    }

    /// `base` with each `NAME=VALUE` of `settings` set (split at the first `=`: the value may hold more).
    static func environment(_ base: [String: String], adding settings: [String]) -> [String: String] {
        var environment = base
        for setting in settings {
            let parts = setting.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            environment[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
        }
        return environment
    }

    /// Every log `arguments` name, as `--log NAME` or `--log=NAME`.
    static func logs(in arguments: [String]) -> [String] {
        arguments.indices.compactMap { index in
            if arguments[index] == "--log" { return arguments.indices.contains(index + 1) ? arguments[index + 1] : "" }
            return arguments[index].hasPrefix("--log=") ? String(arguments[index].dropFirst("--log=".count)) : nil
        }
    }

    struct Side {
        var name: String
        var executable: String
        var environment: [String]
    }

    /// One round's figures, read from the round's line of `e2e`'s output, so that builds older than this
    /// command can be side A or B (before e2d6145 the line has no latency-run CPU).
    struct Round {
        var perSecond: Double
        /// End to end in V, when the run measured V.
        var inV: Double?
        var cpuMicroseconds: Double
        /// The latency run's CPU per notification (nil from builds before e2d6145).
        var steadyCPUMicroseconds: Double?
        var p99: Double
        var peakRSSMiB: Double

        init?(line: Substring) {
            guard line.contains(" round "),
                let perSecond = Self.number(in: line, #/(\d+) notifications/s end to end/#),
                let cpu = Self.number(in: line, #/(\d+) µs relay CPU per notification/#),
                let rss = Self.number(in: line, #/peak RSS (\d+) MiB/#),
                let p99 = Self.number(in: line, #/p99 ([\d.]+) ms/#)
            else { return nil }
            self.perSecond = perSecond
            inV = Self.number(in: line, #/end to end \(([\d.]+) V\)/#)
            cpuMicroseconds = cpu
            steadyCPUMicroseconds = Self.number(in: line, #/relay CPU (\d+) µs per notification/#)
            self.p99 = p99
            peakRSSMiB = rss
        }

        private static func number(in line: Substring, _ pattern: Regex<(Substring, Substring)>) -> Double? {
            line.firstMatch(of: pattern).flatMap { Double($0.output.1) }
        }

        var summary: String {
            "\(inV.map { String(format: "%.3f V", $0) } ?? "\(Int(perSecond))/s") end to end, \(Int(cpuMicroseconds)) µs relay CPU, p99 \(ABBench.milliseconds(p99))"
        }
    }

    /// Runs one e2e round of `side`, its progress on this process's stderr, and reads its round's line.
    private func run(_ side: Side, _ arguments: [String]) throws -> Round {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: side.executable)
        process.arguments = arguments
        process.environment = Self.environment(ProcessInfo.processInfo.environment, adding: side.environment)
        let output = Pipe()
        process.standardOutput = output
        // So that Ctrl-C and the run's own timers reach the e2e run and its children.
        try process.runWithSignalsUnblocked()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            let how = process.terminationReason == .exit ? "exited with \(process.terminationStatus)" : "was killed by signal \(process.terminationStatus)"
            throw RunFailed(description: "\(side.name)'s e2e run \(how) (its errors are above)")
        }
        guard let round = text.split(separator: "\n").lazy.compactMap(Round.init(line:)).first else {
            throw RunFailed(description: "\(side.name)'s e2e run printed no round line this command can read; its output:\n\(text)")
        }
        return round
    }

    struct RunFailed: Error, CustomStringConvertible {
        var description: String
    }

    /// The medians (ranges) of each side, and the pairs' differences, as a Markdown table.
    static func report(a: [Round], b: [Round]) -> String {
        // In V only when every run measured it; else notifications/s.
        let inV = a.allSatisfy { $0.inV != nil } && b.allSatisfy { $0.inV != nil }
        var rows: [(String, (Round) -> Double, (Double) -> String, lowerIsBetter: Bool)] = [
            inV ? ("end to end", { $0.inV ?? 0 }, { String(format: "%.3f V", $0) }, false) : ("end to end", \.perSecond, { "\(Int($0.rounded()))/s" }, false),
            ("relay CPU per notification", \.cpuMicroseconds, { "\(Int($0.rounded())) µs" }, true),
        ]
        if (a + b).allSatisfy({ $0.steadyCPUMicroseconds != nil }) {
            rows.append(("relay CPU in the latency run", { $0.steadyCPUMicroseconds ?? 0 }, { "\(Int($0.rounded())) µs" }, true))
        }
        rows += [
            ("p99 in the latency run", \.p99, milliseconds, true),
            ("peak RSS", \.peakRSSMiB, { "\(Int($0.rounded())) MiB" }, true),
        ]
        var lines = ["", "| | A | B | B − A, pair by pair: median (range) | B better in |", "| --- | ---: | ---: | ---: | ---: |"]
        for (name, value, format, lowerIsBetter) in rows {
            let left = a.map(value)
            let right = b.map(value)
            let differences = zip(left, right).map { $1 - $0 }
            let better = differences.filter { lowerIsBetter ? $0 < 0 : $0 > 0 }.count
            func cell(_ values: [Double], _ show: (Double) -> String) -> String {
                "\(show(median(values))) (\(show(values.min()!))–\(show(values.max()!)))"
            }
            // A difference that shows as zero gets no sign.
            let signed: (Double) -> String = { format(abs($0)) == format(0) ? format(0) : ($0 > 0 ? "+" : "−") + format(abs($0)) }
            lines.append(
                "| \(name) | \(cell(left, format)) | \(cell(right, format)) | \(cell(differences, signed)) | \(better) of \(differences.count) |")
        }
        return lines.joined(separator: "\n")
    }

    /// A latency as e2e prints it: one decimal under 10 ms, whole milliseconds above.
    static func milliseconds(_ value: Double) -> String {
        String(format: abs(value) < 10 ? "%.1f ms" : "%.0f ms", value)
    }

    /// The middle value; for an even count, the mean of the two middle ones.
    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }
}
