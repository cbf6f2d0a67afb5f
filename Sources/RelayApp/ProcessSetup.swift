public import Logging
public import RelayConfig
public import RelayCore
public import RelayKafka
import RelayGooglePlay
import RelayStripe
import RelayPaddle

/// Why a process could not be set up: the configuration (exit 78), Kafka or the record log (exit 69),
/// or another failure, named by its type.
public enum RelaySetupError: Error, CustomStringConvertible {
    case configuration(ConfigurationError)
    case kafka(KafkaError)
    case log(RecordLogError)
    case other(String)

    public var description: String {
        switch self {
        case .configuration(let error): "\(error)"
        case .kafka(let error): "\(error)"
        case .log(let error): "\(error)"
        case .other(let what): "setting up the process failed: \(what)"
        }
    }
}

extension StoreAPIs {
    /// The real store API clients of the apps that configure them (`google.playApi`, `stripe.api`).
    public static func configured(_ configuration: RelayConfiguration, logger: Logger) throws(ConfigurationError) -> StoreAPIs {
        StoreAPIs(
            play: try GooglePlayClient.clients(for: configuration, logger: logger), stripe: StripeClient.clients(for: configuration, logger: logger),
            paddle: PaddleClient.clients(for: configuration, logger: logger))
    }
}
