import Foundation
import Logging
import RelayIngest
import RelayCore
import ServiceLifecycle
import Synchronization

/// Flips readiness to not-ready as the very first step of a graceful shutdown (it is among the last
/// services in the group, so it is shut down first, with the shutdown watchdog).
struct ReadinessService: Service {
    let health: HealthState

    func run() async throws {
        try? await gracefulShutdown()
        health.markShuttingDown()
    }
}

/// Keeps the record log open until graceful shutdown reaches it (after every service that produces or
/// consumes has stopped), then closes it: every acknowledged append stays acknowledged, every waiting one
/// gets its answer.
struct RecordLogService: Service {
    let log: any RecordLog

    func run() async throws {
        try? await gracefulShutdown()
        await log.close()
    }
}

/// The services of one process still running, by name: what a shutdown past its deadline abandons.
final class RunningServices: Sendable {
    private let names = Mutex<[String: Int]>([:])

    func started(_ name: String) { names.withLock { $0[name, default: 0] += 1 } }

    func stopped(_ name: String) {
        names.withLock { names in
            names[name, default: 1] -= 1
            if names[name] == 0 { names[name] = nil }
        }
    }

    var running: [String] { names.withLock { $0.keys.sorted() } }
}

/// A service whose run is recorded in `RunningServices` under its name.
struct TrackedService: Service {
    let name: String
    let inner: any Service
    let registry: RunningServices

    init(_ inner: any Service, registry: RunningServices) {
        self.inner = inner
        self.registry = registry
        // `Application<RouterResponder<...>>` reads as `Application`.
        self.name = String(String(describing: type(of: inner)).prefix { $0 != "<" })
    }

    func run() async throws {
        registry.started(name)
        defer { registry.stopped(name) }
        try await inner.run()
    }
}

/// Bounds a graceful shutdown by the relay's own deadline: `shutdownTimeout` for the services to stop,
/// then `cancellationGrace` for the ones cancelled at that point to return. A process still running
/// then (a Kafka consumer that cannot leave its group because the broker stopped answering, a blocking
/// call that ignores cancellation) logs what it abandons and exits with `exitCode` (75), on a thread of
/// its own, instead of the service group's fatal error. Nothing is lost by that: offsets are stored
/// only after the work, so the next owner of the partitions does what was left.
///
/// The last service in the group, so the first to hear of the shutdown; its run returns at once then.
struct ShutdownWatchdog: Service {
    static let exitCode: Int32 = 75
    static let cancellationGrace: Duration = .seconds(5)

    let shutdownTimeout: Duration
    let registry: RunningServices
    let logger: Logger

    func run() async throws {
        // Armed by a graceful shutdown, and also when the group is cancelled instead (a service failed or
        // returned): the group then waits for cancelled services without a bound of its own.
        try? await gracefulShutdown()
        let deadline = shutdownTimeout + Self.cancellationGrace
        let registry = self.registry
        let logger = self.logger
        startDedicatedThread(named: "shutdown-watchdog") {
            // Sleeps on this thread (no task): the cooperative pool may be what is stuck.
            let end = ContinuousClock.now + deadline
            while ContinuousClock.now < end {
                let (seconds, attoseconds) = (end - ContinuousClock.now).components
                var pause = timespec(tv_sec: Int(max(0, seconds)), tv_nsec: Int(max(0, attoseconds) / 1_000_000_000))
                var left = timespec()
                _ = nanosleep(&pause, &left)
            }
            // Should writing the log line block (a full stderr pipe), exit all the same.
            startDedicatedThread(named: "shutdown-watchdog-exit") {
                var pause = timespec(tv_sec: 2, tv_nsec: 0)
                var left = timespec()
                _ = nanosleep(&pause, &left)
                _exit(Self.exitCode)
            }
            logger.error(
                "shutdown deadline passed; exiting and leaving unfinished work to the next owner of the partitions (offsets are stored only after work, so nothing is lost)",
                metadata: [
                    "shutdown.deadline": "\(deadline)", "shutdown.still_stopping": "\(registry.running.joined(separator: ","))",
                    "exit.code": "\(Self.exitCode)",
                ])
            fflush(nil)
            _exit(Self.exitCode)
        }
    }
}
