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
            do {
                return try EmbeddedRecordLog.open(configuration: configuration, directory: directory, owner: false, logger: logger)
            } catch {
                throw .log(RecordLogError(code: .other, reason: "cannot open the embedded log in \(directory): \(error)", isRetriable: false))
            }
        }
        let kafka = KafkaConfiguration(
            bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, properties: configuration.kafka.properties, clientID: clientID)
        return KafkaRecordLog(configuration: kafka, producer: KafkaProducerConfiguration(deliveryTimeout: .seconds(30)), logger: logger)
    }
}
