public import Logging
public import RelayConfig
public import RelayDelivery
public import RelayKafka
public import RelayCore

/// `revenue-relay replay` against Kafka: the dead-letter topic and the replay ledger read with
/// `KafkaTopicReader`, re-drives produced with an idempotent, acks=all producer.
public enum ReplayCommand {
    /// Why a replay could not run or finish.
    public enum Failure: Error, CustomStringConvertible {
        /// Kafka unreachable, a topic missing, a produce not acknowledged (exit 69).
        case unavailable(String)

        public var description: String {
            switch self {
            case .unavailable(let message): message
            }
        }
    }

    public static func run(
        configuration: RelayConfiguration, bootstrapServers: String?, filter: ReplayFilter, rate: Double, dryRun: Bool, logger: Logger,
        progress: (ReplaySummary, Int64) -> Void = { _, _ in }, candidate: (ReplayCandidate) -> Void = { _ in }
    ) async throws(Failure) -> ReplaySummary {
        let kafka = KafkaConfiguration(
            bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, properties: configuration.kafka.properties,
            clientID: "revenue-relay-replay")
        let topics = configuration.kafka.topics
        let ledger: KafkaTopicReader
        let deadLetters: KafkaTopicReader
        do {
            ledger = try KafkaTopicReader(configuration: kafka, topic: topics.replayed, logger: logger)
        } catch {
            throw .unavailable(
                "cannot read the replay ledger \(topics.replayed) (\(error)); it must exist, compacted (cleanup.policy=compact), before replay runs")
        }
        do {
            deadLetters = try KafkaTopicReader(configuration: kafka, topic: topics.deadLetter, logger: logger)
        } catch {
            await ledger.close()
            throw .unavailable("cannot read the dead-letter topic \(topics.deadLetter): \(error)")
        }
        let producer: KafkaProducer
        do {
            producer = try KafkaProducer(configuration: kafka, producer: KafkaProducerConfiguration(deliveryTimeout: .seconds(30)), logger: logger)
        } catch {
            await ledger.close()
            await deadLetters.close()
            throw .unavailable("cannot create a Kafka producer: \(error)")
        }
        let replay = DeadLetterReplay(configuration: configuration, producer: producer)
        do {
            let summary = try await replay.run(
                deadLetters: KafkaSnapshot(reader: deadLetters), ledger: KafkaSnapshot(reader: ledger), filter: filter, rate: rate, dryRun: dryRun,
                progress: progress, candidate: candidate)
            await producer.close()
            return summary
        } catch {
            await producer.close()
            throw .unavailable("replay stopped: \(error); what was re-driven so far is recorded, run it again to continue")
        }
    }
}

private struct KafkaSnapshot: TopicSnapshot {
    let reader: KafkaTopicReader
    var expectedCount: Int64 { reader.expectedCount }
    var records: AsyncThrowingStream<ConsumedRecord, any Error> { reader.records }
    func close() async { await reader.close() }
}
