import Logging
import RelayIngest
import RelayCore
import ServiceLifecycle

/// Flips readiness to not-ready as the very first step of a graceful shutdown (it is the last
/// service in the group, so it is shut down first).
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
