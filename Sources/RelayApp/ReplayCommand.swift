import Logging
public import RelayConfig
public import RelayDelivery
public import RelayCore

/// `revenue-relay replay` on either log: the dead-letter topic and the replay ledger read to their ends,
/// re-drives appended with the log's producer (acknowledged durably before the ledger records them).
public enum ReplayCommand {
    /// Why a replay could not run or finish.
    public enum Failure: Error, CustomStringConvertible {
        /// The log unreachable, a topic missing, an append not acknowledged (exit 69).
        case unavailable(String)

        public var description: String {
            switch self {
            case .unavailable(let message): message
            }
        }
    }

    public static func run(
        configuration: RelayConfiguration, log: any RecordLog, filter: ReplayFilter, rate: Double, dryRun: Bool,
        progress: (ReplaySummary, Int64) -> Void = { _, _ in }, candidate: (ReplayCandidate) -> Void = { _ in }
    ) async throws(Failure) -> ReplaySummary {
        let topics = configuration.topics
        let ledger: any TopicSnapshot
        let deadLetters: any TopicSnapshot
        do {
            ledger = try log.snapshot(of: topics.replayed)
        } catch {
            throw .unavailable(
                "cannot read the replay ledger \(topics.replayed) (\(error)); on Kafka it must exist, compacted (cleanup.policy=compact), before replay runs")
        }
        do {
            deadLetters = try log.snapshot(of: topics.deadLetter)
        } catch {
            await ledger.close()
            throw .unavailable("cannot read the dead-letter topic \(topics.deadLetter): \(error)")
        }
        let producer: any RecordProducer
        do {
            producer = try log.producer
        } catch {
            await ledger.close()
            await deadLetters.close()
            throw .unavailable("cannot append to the log: \(error)")
        }
        let replay = DeadLetterReplay(configuration: configuration, producer: producer)
        do {
            let summary = try await replay.run(
                deadLetters: deadLetters, ledger: ledger, filter: filter, rate: rate, dryRun: dryRun, progress: progress, candidate: candidate)
            await log.close()
            return summary
        } catch {
            await log.close()
            throw .unavailable("replay stopped: \(error); what was re-driven so far is recorded, run it again to continue")
        }
    }
}
