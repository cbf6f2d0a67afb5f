import ArgumentParser
import Foundation
import Glibc
import Logging
import RelayApp
import RelayConfig
import RelayCore

/// `revenue-relay dev`'s process (the bench's `e2e-relay`, the same code), its stdout read for the addresses; on
/// `kafka` beside its broker (`BrokerChild`).
final class RelayChild: @unchecked Sendable {
    let ingest: String
    let logPath: String
    /// On `kafka`, the Kafka-protocol broker in a process of its own, as a deployment's Kafka is: the relay's CPU
    /// and memory are then its own, not the broker's too.
    let broker: BrokerChild?
    private let process: Process
    /// The relay's stdin, held open for its life: it exits when this process does.
    private let input: Pipe
    private let stats: ChildStats
    private let directory: String

    /// - Parameter history: an events store to start from (`e2e --recorded`).
    init(kind: E2EBench.LogKind, configuration: String, directory: String, history: RecordedHistory? = nil) throws {
        let folder = directory + "/relay-e2e-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        // The backend's database: in the data directory on the embedded log (dev), beside relay.yaml on Kafka
        // (`backend.database: backend.sqlite`, relative to the configuration's folder).
        do {
            try history?.copy(toEventsFileOf: kind == .kafka ? folder + "/backend.sqlite" : folder + "/data/backend.sqlite")
        } catch {
            // A partial copy of a large file, and no log worth keeping.
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
        try Data(configuration.utf8).write(to: URL(fileURLWithPath: folder + "/relay.yaml"))
        logPath = folder + "/relay.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let broker = kind == .kafka ? try BrokerChild(configuration: folder + "/relay.yaml", log: folder + "/broker.log") : nil
        let arguments =
            ["e2e-relay", "--config", folder + "/relay.yaml"]
            + (broker.map { ["--bootstrap-servers", $0.bootstrapServers] } ?? ["--data", folder + "/data"])
        let process: Process
        do {
            (process, input, ingest) = try startChild(
                arguments, announcing: "ingest: ", what: "the relay", log: logPath,
                logs: broker == nil ? nil : "\(logPath) (its broker's: \(folder)/broker.log)", directory: folder)
        } catch {
            broker?.stop()
            throw error
        }
        self.broker = broker
        self.process = process
        stats = ChildStats(process.processIdentifier)
        self.directory = folder
    }

    /// Waits until the relay has been idle for a 200 ms window (at most 20 ms of CPU in it, two clock
    /// ticks; at most a minute) and returns the start of that window (wall clock, ns): when its work ended,
    /// up to one window late. Idle CPU is taken as done work: a relay waiting on a retry's backoff would
    /// pass for idle, which a benchmark run without failures does not do.
    @discardableResult
    func waitUntilIdle() async throws -> Int64 {
        let deadline = ContinuousClock.now + .seconds(60)
        var last = cpuSeconds()
        var windowStart = wallClockNanoseconds()
        while ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
            let now = cpuSeconds()
            if now - last <= 0.02 { return windowStart }
            last = now
            windowStart = wallClockNanoseconds()
        }
        note("the relay was still busy after a minute; measuring anyway")
        return windowStart
    }

    /// The relay's user and system CPU time so far, seconds.
    func cpuSeconds() -> Double { stats.cpuSeconds() }

    /// The relay's peak resident memory so far (VmHWM), bytes.
    func peakRSS() -> Int { stats.peakRSS() }

    /// The relay, then its broker (on `kafka`).
    func stop() {
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        broker?.stop()
    }

    /// Its data and log; kept when a round failed, for the log.
    func removeFiles() {
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// `revenue-relay dev` for `e2e` (hidden): the same process setup (`DevEnvironment`), so the bench needs no
/// second build product. On the embedded log in `--data`; with `--bootstrap-servers`, `dev --kafka`'s relay on
/// the broker there (`e2e-broker`'s, in its own process). It exits when the bench does (its stdin closes).
struct E2ERelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "e2e-relay", abstract: "The relay of `e2e`.", shouldDisplay: false)

    @Option var config: String
    @Option var data: String?
    @Option var bootstrapServers: String?

    func run() async throws {
        exitWhenStandardInputCloses()
        // As `revenue-relay` logs (the repeat limit included): its lines cost what the service's do.
        bootstrapLogging()
        let configuration = try RelayConfiguration.load(path: config)
        let logger = Logger(label: "revenue-relay")
        let environment =
            if let bootstrapServers {
                try DevEnvironment(configuration: configuration, bootstrapServers: bootstrapServers, logger: logger)
            } else {
                try DevEnvironment(configuration: configuration, dataDirectory: data, logger: logger)
            }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await environment.process.run() }
            group.addTask {
                guard let port = await environment.process.httpPort(), await environment.process.backendAddress.valueUnlessCancelled() != nil
                else { return }
                FileHandle.standardOutput.write(Data("ingest: http://127.0.0.1:\(port)\n".utf8))
            }
            // As `dev`: a relay that fails to start ends this process (and the bench's wait for its line) at once.
            while try await group.next() != nil {}
        }
    }
}

/// `e2e`'s Kafka-protocol broker (hidden): `dev --kafka`'s in-memory cluster (`DevEnvironment.makeCluster`), in
/// a process of its own until it is terminated or the bench exits (its stdin closes).
struct E2EBroker: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "e2e-broker", abstract: "The Kafka-protocol broker of `e2e`.", shouldDisplay: false)

    @Option var config: String

    func run() async throws {
        exitWhenStandardInputCloses()
        bootstrapLogging()
        let configuration = try RelayConfiguration.load(path: config)
        let cluster = try DevEnvironment.makeCluster(for: configuration, logger: Logger(label: "e2e-broker"))
        FileHandle.standardOutput.write(Data("kafka: \(cluster.bootstrapServers)\n".utf8))
        while true { try await Task.sleep(for: .seconds(3600)) }
    }
}

/// A bench child's stdin is a pipe whose other end only the bench holds (`startChild`): when
/// it reads end of file the bench has gone (killed, crashed, interrupted), and the child exits rather than keep
/// its ports and memory.
func exitWhenStandardInputCloses() {
    let thread = Thread {
        var byte: UInt8 = 0
        while read(STDIN_FILENO, &byte, 1) > 0 {}
        exit(0)
    }
    thread.name = "parent-watch"
    thread.start()
}

/// Starts this executable with `arguments`, its stderr to `log` (nil: this process's), and reads the line it
/// announces itself with (`prefix`, then what `parse` makes of the rest). Returns it with that and the pipe of
/// its stdin, which the caller keeps open for the child's life (`exitWhenStandardInputCloses`). A child that
/// exits first, or whose line `parse` refuses, is stopped, and the error names `logs` (default: `log`).
func startChild<Announced>(
    _ arguments: [String], announcing prefix: String, what: String, log: String?, logs: String? = nil, directory: String? = nil,
    parse: (String) throws -> Announced = { $0 }
) throws -> (Process, input: Pipe, announced: Announced) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    process.arguments = arguments
    if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
    let (output, input) = (Pipe(), Pipe())
    process.standardOutput = output
    process.standardInput = input
    if let log { process.standardError = FileHandle(forWritingAtPath: log) }
    try process.runWithSignalsUnblocked()
    do {
        // Byte by byte: nothing after the line is read from the pipe.
        let handle = output.fileHandleForReading
        var line = ""
        while true {
            let byte = handle.readData(ofLength: 1)
            guard !byte.isEmpty else { throw ValidationError("\(what) did not start\((logs ?? log).map { "; its log: \($0)" } ?? "")") }
            line += String(decoding: byte, as: UTF8.self)
            guard line.hasSuffix("\n") else { continue }
            if line.hasPrefix(prefix) { return (process, input, try parse(String(line.dropFirst(prefix.count).dropLast()))) }
            line = ""
        }
    } catch {
        process.terminate()
        process.waitUntilExit()
        throw error
    }
}

/// `e2e-broker` in a child process.
final class BrokerChild: @unchecked Sendable {
    let bootstrapServers: String
    private let process: Process
    /// The broker's stdin, held open for its life: it exits when this process does.
    private let input: Pipe
    private let stats: ChildStats

    init(configuration: String, log: String) throws {
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        (process, input, bootstrapServers) = try startChild(["e2e-broker", "--config", configuration], announcing: "kafka: ", what: "the broker", log: log)
        stats = ChildStats(process.processIdentifier)
    }

    /// The broker's user and system CPU time so far, seconds.
    func cpuSeconds() -> Double { stats.cpuSeconds() }

    /// The broker's peak resident memory so far (VmHWM), bytes.
    func peakRSS() -> Int { stats.peakRSS() }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// A child process's CPU time and peak memory, from /proc.
struct ChildStats {
    let pid: Int32

    init(_ pid: Int32) { self.pid = pid }

    /// User and system CPU time so far, seconds.
    func cpuSeconds() -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return 0 }
        // Fields after "(comm)": state is field 3; utime and stime are fields 14 and 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        return ((Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0)) / ticks
    }

    /// Peak resident memory so far (VmHWM), bytes.
    func peakRSS() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") })
        else { return 0 }
        return (Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0) * 1024
    }
}
