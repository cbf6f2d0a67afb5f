#ifndef REVENUE_RELAY_CRDKAFKA_SHIM_H
#define REVENUE_RELAY_CRDKAFKA_SHIM_H

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

/// `rd_kafka_producev` is variadic (RD_KAFKA_V_* macros), which Swift cannot call.
/// On success librdkafka takes ownership of `headers`; on failure the caller still owns them.
/// The payload and key are copied (RD_KAFKA_MSG_F_COPY), so the caller's buffers may be freed at once.
static inline rd_kafka_resp_err_t relay_rd_kafka_produce(rd_kafka_t *rk,
                                                        const char *topic,
                                                        const void *key, size_t key_len,
                                                        const void *value, size_t value_len,
                                                        rd_kafka_headers_t *headers,
                                                        int32_t partition,
                                                        void *opaque) {
    return rd_kafka_producev(rk,
                             RD_KAFKA_V_TOPIC(topic),
                             RD_KAFKA_V_PARTITION(partition),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                             RD_KAFKA_V_KEY(key, key_len),
                             RD_KAFKA_V_VALUE((void *)value, value_len),
                             RD_KAFKA_V_HEADERS(headers),
                             RD_KAFKA_V_OPAQUE(opaque),
                             RD_KAFKA_V_END);
}

/// `rkmessage->_private` is the per-message opaque given to `relay_rd_kafka_produce`.
static inline void *relay_rd_kafka_message_opaque(const rd_kafka_message_t *message) {
    return message->_private;
}

static inline int32_t relay_rd_kafka_partition_ua(void) { return RD_KAFKA_PARTITION_UA; }

#endif
