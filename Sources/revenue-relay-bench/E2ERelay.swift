import ArgumentParser
import Foundation
import Glibc
import Logging
import RelayApp
import RelayConfig
import RelayCore

/// `revenue-relay dev`'s process (the bench's `e2e-relay`, the same code), its stdout read for the addresses.
final class RelayChild: @unchecked Sendable {
    let ingest: String
    let logPath: String
    private let process: Process
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
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = ["e2e-relay", "--config", folder + "/relay.yaml"] + (kind == .kafka ? ["--kafka"] : ["--data", folder + "/data"])
        process.currentDirectoryURL = URL(fileURLWithPath: folder)
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle(forWritingAtPath: logPath)
        try process.runWithSignalsUnblocked()
        var ingest: String?
        let handle = output.fileHandleForReading
        var line = ""
        while ingest == nil {
            let byte = handle.readData(ofLength: 1)
            guard !byte.isEmpty else { throw ValidationError("the relay did not start; its log: \(logPath)") }
            line += String(decoding: byte, as: UTF8.self)
            if line.hasSuffix("\n") {
                if line.hasPrefix("ingest: ") { ingest = String(line.dropFirst("ingest: ".count).dropLast()) }
                line = ""
            }
        }
        self.ingest = ingest!
        self.process = process
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
    func cpuSeconds() -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return 0 }
        // Fields after "(comm)": state is field 3; utime and stime are fields 14 and 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        return ((Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0)) / ticks
    }

    /// The relay's peak resident memory so far (VmHWM), bytes.
    func peakRSS() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") })
        else { return 0 }
        return (Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0) * 1024
    }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    /// Its data and log; kept when a round failed, for the log.
    func removeFiles() {
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// `revenue-relay dev` for `e2e` (hidden): the same process setup, so the bench needs no second build product.
struct E2ERelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "e2e-relay", abstract: "The relay of `e2e`.", shouldDisplay: false)

    @Option var config: String
    @Option var data: String?
    @Flag var kafka = false

    func run() async throws {
        // As `revenue-relay` logs (the repeat limit included): its lines cost what the service's do.
        bootstrapLogging()
        let configuration = try RelayConfiguration.load(path: config)
        let environment = try DevEnvironment(configuration: configuration, dataDirectory: data, kafka: kafka, logger: Logger(label: "revenue-relay"))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await environment.process.run() }
            group.addTask {
                let port = await environment.process.waitForHTTPPort()
                _ = await environment.process.backendAddress.value()
                FileHandle.standardOutput.write(Data("ingest: http://127.0.0.1:\(port)\n".utf8))
            }
            try await group.waitForAll()
        }
    }
}
