internal import CRdKafka

/// Builds an `rd_kafka_conf_t`. Owns it until `RDKafkaClient.make` hands it to `rd_kafka_new`.
final class RDKafkaConfig {
    private(set) var pointer: OpaquePointer?

    init() {
        pointer = rd_kafka_conf_new()
    }

    deinit {
        // Only still set when rd_kafka_new never took it.
        if let pointer { rd_kafka_conf_destroy(pointer) }
    }

    /// Sets one property; the error names the key (values may be secrets and are never echoed).
    func set(_ key: String, _ value: String) throws(KafkaError) {
        var errorBuffer = [CChar](repeating: 0, count: 512)
        let result = rd_kafka_conf_set(pointer, key, value, &errorBuffer, errorBuffer.count)
        guard result == RD_KAFKA_CONF_OK else {
            let detail = String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw .configuration("kafka property \(key): \(detail)")
        }
    }

    func set(_ properties: [String: String]) throws(KafkaError) {
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) { try set(key, value) }
    }

    /// Gives up ownership: called once `rd_kafka_new` succeeded, which now owns the conf.
    func release() -> OpaquePointer? {
        defer { pointer = nil }
        return pointer
    }
}
