import ArgumentParser
import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore

@main
struct RevenueRelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revenue-relay",
        abstract: "Receives App Store, Google Play, Stripe and Paddle server notifications, verifies and standardizes them, keeps entitlements current and delivers signed webhooks, on Kafka or an embedded durable log.",
        version: RelayVersion.current,
        subcommands: [
            Dev.self, Run.self, Replay.self, Tail.self, Topics.self, Copy.self, Inspect.self, Events.self, Revenue.self, Deliveries.self, Endpoints.self, Import.self, Recover.self,
            Reconcile.self, Grant.self, Revoke.self,
        ]
    )
}

/// Exit codes of docs/contracts.md, Command line (sysexits): 64 bad arguments, 65 rejected input (inspect),
/// 69 a dependency unavailable (inspect could not fetch keys), 78 bad configuration.
enum Exit {
    static let badConfiguration = ExitCode(78)
    static let badArguments = ExitCode(64)
    static let rejected = ExitCode(65)
    static let unavailable = ExitCode(69)
}

func loadConfiguration(_ path: String) throws -> RelayConfiguration {
    do {
        return try RelayConfiguration.load(path: path)
    } catch {
        FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
        throw Exit.badConfiguration
    }
}

/// Sets up a process, or exits 78 with the configuration problem.
func makeProcess<Result>(_ body: () throws(RelaySetupError) -> Result) throws -> Result {
    do {
        return try body()
    } catch .configuration(let error) {
        FileHandle.standardError.write(Data("revenue-relay: \(error)\n".utf8))
        throw Exit.badConfiguration
    } catch .log(let error) {
        FileHandle.standardError.write(Data("revenue-relay: \(error.reason)\n".utf8))
        throw Exit.unavailable
    } catch {
        throw error
    }
}

func printLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

struct Dev: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run everything in one process on loopback: the embedded durable log (or, with --kafka, an in-memory Kafka broker), the ingest, the worker, the deliverer and the local backend.",
        discussion: """
            By default the log and the backend's database are kept in the data directory (--data, default \
            .revenue-relay/dev): stopping and starting dev keeps every topic, offset, subscription state and \
            dead letter. --kafka runs librdkafka's in-memory Kafka-protocol broker instead (nothing kept), for \
            trying Kafka tools. Prints the ingest, backend and log addresses once ready.
            """
    )

    @Option(help: "Configuration file.")
    var config = "config/dev.yaml"

    @Option(help: "Data directory of the embedded log and the backend's database.")
    var data: String?

    @Flag(help: "Use an in-memory Kafka-protocol broker instead of the embedded log (nothing is kept).")
    var kafka = false

    func run() async throws {
        bootstrapLogging()
        if kafka, data != nil { throw ValidationError("--data is for the embedded log; with --kafka nothing is kept") }
        let configuration = try loadConfiguration(config)
        let logger = Logger(label: "revenue-relay")
        let (data, kafka) = (data, kafka)
        let environment = try makeProcess { () throws(RelaySetupError) in
            try DevEnvironment(configuration: configuration, dataDirectory: data, kafka: kafka, logger: logger)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await environment.process.run() }
            group.addTask {
                guard let port = await environment.process.httpPort(),
                    let backend = await environment.process.backendAddress.valueUnlessCancelled()
                else { return }
                printLine("ingest: http://127.0.0.1:\(port)")
                printLine("backend: \(backend)")
                // After the three lines the contract names, in its order (programs read them as they come).
                printLine(environment.logLine)
                printLine("console: \(backend)/console")
            }
            // next(), not waitForAll(): when the process fails (a service could not start) its error ends
            // dev at once, cancelling the wait for an address that will never come.
            while try await group.next() != nil {}
        }
    }
}

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run in production, on Apache Kafka or (log.kind: embedded) the embedded durable log of one machine.",
        discussion: "Roles: ingest, worker, deliverer, backend (default: ingest,worker,deliverer). On the embedded log one process owns log.path: run every role in it."
    )

    @Option(help: "Configuration file.")
    var config: String

    @Option(name: .customLong("role"), help: "Comma-separated roles to run.")
    var roles: String?

    @Option(name: .customLong("bootstrap-servers"), help: "Overrides kafka.bootstrapServers.")
    var bootstrapServers: String?

    func run() async throws {
        bootstrapLogging()
        let logger = Logger(label: "revenue-relay")
        var selected = Role.defaultRoles
        if let roles {
            do {
                selected = try Role.parse(roles)
            } catch {
                throw ValidationError(error.message)
            }
        }
        let configuration = try loadConfiguration(config)
        let process = try makeProcess { () throws(RelaySetupError) in
            try RelayProcess(configuration: configuration, roles: selected, bootstrapServers: bootstrapServers, logger: logger)
        }
        logger.info("starting", metadata: [LogKey.role: "\(selected.map(\.rawValue).joined(separator: ","))"])
        try await process.run()
    }
}
