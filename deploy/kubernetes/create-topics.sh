#!/bin/sh
# Creates revenue-relay's Kafka topics with Kafka's own kafka-topics.sh (run in the apache/kafka image:
# the Kubernetes Job in topics-job.yaml and the `topics` service of deploy/compose.yaml). revenue-relay
# itself creates no topics on Kafka (only `dev` and the embedded log do).
#
# Idempotent: --if-not-exists, so running it again changes nothing. It never alters an existing topic:
# add partitions or change a config with kafka-topics.sh --alter / kafka-configs.sh yourself.
#
# The names are the defaults of the configuration's `topics` section; set TOPIC_* when the
# configuration renames them. RETRY_STEPS must equal the number of steps of delivery.retrySchedule
# (one retry topic per step: relay.deliveries.retry.1 ... .N).
set -eu

: "${BOOTSTRAP_SERVERS:?set BOOTSTRAP_SERVERS (host:port,...)}"
PARTITIONS="${PARTITIONS:-6}"
REPLICATION_FACTOR="${REPLICATION_FACTOR:-1}"
MIN_INSYNC_REPLICAS="${MIN_INSYNC_REPLICAS:-1}"
RETRY_STEPS="${RETRY_STEPS:-7}"
# How long records are kept (ms): 7 days, the embedded log's default. The retry topics must keep a
# record for at least the longest wait (10 h step, +20% jitter, up to 2x for Retry-After).
RETENTION_MS="${RETENTION_MS:-604800000}"
# The dead-letter topic keeps records until this size per partition (bytes), like the embedded log.
DEAD_LETTER_RETENTION_BYTES="${DEAD_LETTER_RETENTION_BYTES:-1073741824}"
KAFKA_TOPICS="${KAFKA_TOPICS:-/opt/kafka/bin/kafka-topics.sh}"

TOPIC_NOTIFICATIONS="${TOPIC_NOTIFICATIONS:-relay.notifications}"
TOPIC_REJECTED="${TOPIC_REJECTED:-relay.notifications.rejected}"
TOPIC_EVENTS="${TOPIC_EVENTS:-relay.events}"
TOPIC_DELIVERIES="${TOPIC_DELIVERIES:-relay.deliveries}"
TOPIC_RETRY_PREFIX="${TOPIC_RETRY_PREFIX:-relay.deliveries.retry}"
TOPIC_DEAD_LETTER="${TOPIC_DEAD_LETTER:-relay.deliveries.dlq}"
TOPIC_REPLAYED="${TOPIC_REPLAYED:-relay.deliveries.dlq.replayed}"
TOPIC_ATTEMPTS="${TOPIC_ATTEMPTS:-relay.deliveries.attempts}"

# Wait for the cluster (each attempt can itself take a while: the admin client retries inside it).
WAIT_SECONDS="${WAIT_SECONDS:-300}"
deadline=$(($(date +%s) + WAIT_SECONDS))
until "$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP_SERVERS" --list >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "create-topics: Kafka at $BOOTSTRAP_SERVERS did not answer within ${WAIT_SECONDS}s" >&2
        exit 69
    fi
    echo "create-topics: waiting for Kafka at $BOOTSTRAP_SERVERS" >&2
    sleep 5
done

create() {
    name="$1"
    shift
    "$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP_SERVERS" --create --if-not-exists --topic "$name" \
        --partitions "$PARTITIONS" --replication-factor "$REPLICATION_FACTOR" \
        --config "min.insync.replicas=$MIN_INSYNC_REPLICAS" "$@"
    echo "create-topics: $name"
}

# The notifications by time only (retention.bytes=-1 whatever the broker's default): Kafka deletes by
# retention whether or not relay-worker processed a record, and a size bound could be filled by junk
# posted to the ingest. Alert on the worker's age against retention.ms (RevenueRelayWorkerBehindRetention).
create "$TOPIC_NOTIFICATIONS" --config "retention.ms=$RETENTION_MS" --config retention.bytes=-1
create "$TOPIC_REJECTED" --config "retention.ms=$RETENTION_MS"
create "$TOPIC_EVENTS" --config "retention.ms=$RETENTION_MS"
create "$TOPIC_DELIVERIES" --config "retention.ms=$RETENTION_MS"
step=1
while [ "$step" -le "$RETRY_STEPS" ]; do
    create "$TOPIC_RETRY_PREFIX.$step" --config "retention.ms=$RETENTION_MS"
    step=$((step + 1))
done
# Dead letters stay until replayed or the size bound: no time limit.
create "$TOPIC_DEAD_LETTER" --config retention.ms=-1 --config "retention.bytes=$DEAD_LETTER_RETENTION_BYTES"
# replay's ledger: the newest record per key is what counts.
create "$TOPIC_REPLAYED" --config cleanup.policy=compact
# The delivery log's attempts, recorded by the backend role (relay-backend): kept as long as the rest.
create "$TOPIC_ATTEMPTS" --config "retention.ms=$RETENTION_MS"

echo "create-topics: done (an existing topic keeps its partitions and configuration)"
