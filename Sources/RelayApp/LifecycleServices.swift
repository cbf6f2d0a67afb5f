import Logging
import RelayIngest
import RelayKafka
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

/// Keeps a producer open until graceful shutdown reaches it (after every service that produces has
/// stopped), then flushes it: every acknowledged send stays acknowledged, every waiting send gets its answer.
struct ProducerService: Service {
    let producer: KafkaProducer

    func run() async throws {
        try? await gracefulShutdown()
        await producer.close()
    }
}
