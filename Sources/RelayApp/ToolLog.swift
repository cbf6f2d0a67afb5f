import Foundation
public import Logging
public import RelayConfig
public import RelayCore
import RelayEmbeddedLog
import RelayKafka

/// The log a command-line tool (`replay`, `tail`, `topics`) reads and appends to.
public enum ToolLog {
    /// The embedded log in `dataDirectory` (read and appended to while its owner runs; never owned), Kafka
    /// at `bootstrapServers`, or else what the configuration's `log.kind` names.
    public static func open(configuration: RelayConfiguration, bootstrapServers: String?, dataDirectory: String?, clientID: String, logger: Logger)
        throws(RelaySetupError) -> any RecordLog
    {
        if dataDirectory != nil || (bootstrapServers == nil && configuration.log.kind == .embedded) {
            let directory = dataDirectory ?? configuration.log.path
            // A tool never creates a log: a mistyped directory says so instead of showing an empty one.
            guard FileManager.default.fileExists(atPath: directory + "/log.sqlite") else {
                throw .log(RecordLogError(
                    code: .configuration, reason: "there is no embedded log in \(directory) (no log.sqlite): check --data or log.path",
                    isRetriable: false))
            }
            // A tool appends from one caller, each append after the last: no other append could share a paced
            // commit, so pacing would only cap it at one commit per `log.commitInterval`.
            var unpaced = configuration
            unpaced.log.commitInterval = .zero
            do {
                return try EmbeddedRecordLog.open(configuration: unpaced, directory: directory, owner: false, logger: logger)
            } catch {
                throw .log(RecordLogError(code: .other, reason: "cannot open the embedded log in \(directory): \(error)", isRetriable: false))
            }
        }
        let kafka = KafkaConfiguration(
            bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, properties: configuration.kafka.properties, clientID: clientID)
        return KafkaRecordLog(configuration: kafka, producer: KafkaProducerConfiguration(deliveryTimeout: .seconds(30)), logger: logger)
    }
}
