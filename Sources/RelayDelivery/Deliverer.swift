public import CoreMetrics
import DequeModule
public import Logging
public import RelayConfig
public import RelayCore
import RelayHTTPClient
public import ServiceLifecycle
import Synchronization

/// Delivers `relay.deliveries` records as signed webhooks (docs/contracts.md (topics and the webhook payload); docs/delivery.md).
///
/// - **Intake:** one consumer (group `relay-deliverer`) reads `relay.deliveries` and every retry topic.
///   Retry records carry `relay-due-at`; the consumer holds a partition paused at a record that is not
///   yet due, so nothing busy-waits and nothing behind it is read early.
/// - **Sending:** libcurl's multi handle on its own thread (`HTTPTransferEngine`), many transfers at
///   once, kept-alive connections, HTTP/2 where offered. At most `delivery.maxInFlight` records are out
///   (the consumer stops beyond that) and at most `delivery.maxInFlightPerEndpoint` transfers per
///   endpoint; more wait in the endpoint's queue. An endpoint that stalls (at its limit, nothing
///   finished for a second) keeps a queue of its limit and defers the rest to the retry topics, so one
///   slow endpoint cannot take the others' share.
/// - **Signing** at send time with the endpoint's secrets; `webhook-id` is the event's id on every attempt.
/// - **Outcomes:** 2xx marks the record done. Anything else (3xx included: redirects are not followed),
///   a timeout, a connection error or a refused address produces the delivery to the next retry topic,
///   or after the last step to the dead-letter topic, and only then marks the record done. 410 Gone
///   dead-letters at once (`endpoint_gone`) and disables the endpoint in this process.
/// - **Offsets** are stored in order per partition as deliveries finish out of order; a crash before
///   the store repeats the delivery with the same `webhook-id`.
public final class Deliverer: Service {
    let consumer: any RecordConsumer
    let producer: any RecordProducer
    let engine: HTTPTransferEngine
    let lanes: [String: EndpointLane]
    let topics: RelayConfiguration.Topics
    let policy: RetryPolicy
    let options: DelivererOptions
    let timeout: Duration
    let connectTimeout: Duration
    /// How long the deliverer's turn in a graceful shutdown waits for running transfers before aborting
    /// them: half of `shutdownTimeout`, leaving the rest to the worker and the log behind it. (The
    /// services stop one after another; the HTTP server before it may have used up to `ingest.ackTimeout`.)
    let drainTimeout: Duration
    let maxPerEndpoint: Int
    let logger: Logger
    let counters: DeliveryCounters
    let tracker = InFlightTracker()
    /// The records to write for finished attempts (retry, dead letter), in the order decided; the
    /// committer in `run` writes them, each then marking its delivery done.
    let commits: AsyncStream<Commit>
    let commitQueue: AsyncStream<Commit>.Continuation

    struct Commit: Sendable {
        var record: ConsumedRecord
        var outgoing: [OutgoingRecord]
        /// The delivery log's record of this outcome, handed to `attempts` once `outgoing` is written: never in
        /// the same produce, so the log's topic can never hold back (or repeat) a delivery.
        var logged: DeliveryAttempt?
    }
    /// The delivery log's records of successful attempts, written in batches.
    let attempts: AttemptWriter
    /// The timers armed for endpoints held back by their rate or a pause (`armWake`), cancelled when `run` ends.
    let timers = Mutex<(next: UInt64, tasks: [UInt64: Task<Void, Never>])>((0, [:]))

    /// What the deliverer reads of the configuration: the `delivery` section, the endpoints, the topic
    /// names and the shutdown bound.
    public struct Settings: Sendable {
        public var delivery: RelayConfiguration.Delivery
        public var endpoints: [RelayConfiguration.Endpoint]
        public var topics: RelayConfiguration.Topics
        public var shutdownTimeout: Duration

        public init(
            delivery: RelayConfiguration.Delivery, endpoints: [RelayConfiguration.Endpoint], topics: RelayConfiguration.Topics,
            shutdownTimeout: Duration
        ) {
            self.delivery = delivery
            self.endpoints = endpoints
            self.topics = topics
            self.shutdownTimeout = shutdownTimeout
        }

        public init(_ configuration: RelayConfiguration) {
            self.init(
                delivery: configuration.delivery, endpoints: configuration.endpoints, topics: configuration.topics,
                shutdownTimeout: configuration.shutdownTimeout)
        }
    }

    /// The deliverer of `configuration`'s sections (`Settings`). With `deliveryLog` (the local backend's, in this
    /// process) its attempts and endpoint states are recorded there instead of on `topics.attempts`.
    public convenience init(
        configuration: RelayConfiguration, consumer: any RecordConsumer, producer: any RecordProducer, deliveryLog: (any DeliveryLogRecorder)? = nil,
        logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory, options: DelivererOptions = .init()
    ) throws(DelivererSetupError) {
        try self.init(
            settings: Settings(configuration), consumer: consumer, producer: producer, deliveryLog: deliveryLog, logger: logger, metrics: metrics,
            options: options)
    }

    public init(
        settings: Settings, consumer: any RecordConsumer, producer: any RecordProducer, deliveryLog: (any DeliveryLogRecorder)? = nil,
        logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory, options: DelivererOptions = .init()
    ) throws(DelivererSetupError) {
        let delivery = settings.delivery
        var lanes: [String: EndpointLane] = [:]
        for (index, endpoint) in settings.endpoints.enumerated() {
            let signer: WebhookSigner
            do {
                signer = try WebhookSigner(secrets: endpoint.secrets)
            } catch {
                throw DelivererSetupError(key: "endpoints[\(index)].secrets", message: "\(error)")
            }
            lanes[endpoint.id] = EndpointLane(
                id: endpoint.id, app: endpoint.app, url: endpoint.url, signer: signer,
                breaker: CircuitBreaker(threshold: options.breakerThreshold, cooldownMilliseconds: options.breakerCooldown.wholeMilliseconds),
                rate: endpoint.ratePerSecond, metrics: metrics)
        }
        var engineConfiguration = HTTPTransferEngine.Configuration()
        // Per endpoint the lanes limit transfers; several endpoints may share a host, and a transfer
        // waiting in libcurl for a connection would spend its timeout there.
        engineConfiguration.maxConnectionsPerHost = delivery.maxInFlight
        engineConfiguration.maxCachedConnections = max(64, delivery.maxInFlight)
        engineConfiguration.maxResponseBytes = DeliveryRecord.maxResponseBytes * 4
        engineConfiguration.userAgent = "revenue-relay/\(RelayVersion.current)"
        engineConfiguration.keptResponseHeaders = ["retry-after"]
        if !delivery.allowPrivateNetworks {
            engineConfiguration.addressCheck = { AddressPolicy.refusal($0) }
        }
        do {
            self.engine = try HTTPTransferEngine(configuration: engineConfiguration)
        } catch {
            throw DelivererSetupError(key: "delivery", message: "\(error)")
        }
        self.consumer = consumer
        self.producer = producer
        self.lanes = lanes
        self.topics = settings.topics
        self.policy = RetryPolicy(schedule: delivery.retrySchedule, throttledMinimumWait: options.throttledMinimumWait)
        self.options = options
        self.timeout = delivery.timeout
        self.drainTimeout = settings.shutdownTimeout / 2
        self.connectTimeout = min(options.connectTimeout, delivery.timeout)
        self.maxPerEndpoint = delivery.maxInFlightPerEndpoint
        self.logger = logger
        self.counters = DeliveryCounters(metrics: metrics)
        (self.commits, self.commitQueue) = AsyncStream.makeStream(of: Commit.self)
        self.attempts = AttemptWriter(producer: producer, topic: settings.topics.attempts, direct: deliveryLog, logger: logger, metrics: metrics)
    }

    /// What the deliverer consumes: `relay.deliveries` and every retry topic in group `relay-deliverer`,
    /// each record held until its due time, and `delivery.maxInFlight` records out at most.
    public static func consumerOptions(for configuration: RelayConfiguration) -> ConsumerOptions {
        let (group, topics) = configuration.consumerGroups[1]
        return ConsumerOptions(
            groupID: group, topics: topics,
            maxInFlight: configuration.delivery.maxInFlight, dueTime: { DeliveryRecord.dueTime(of: $0) })
    }

    /// Whether the endpoint's circuit breaker is open (or probing); nil for an unknown endpoint.
    public func isCircuitOpen(endpoint: String) -> Bool? { lanes[endpoint]?.isCircuitOpen }

    public func run() async throws {
        await withDiscardingTaskGroup { group in
            // The committer: a child of this task, so a cancelled shutdown cancels its writes too (their
            // deliveries stay not done and are delivered again), and nothing outlives `run`.
            group.addTask { [self] in await runCommitter() }
            group.addTask { [self] in await attempts.run() }
            // Each endpoint's state as this process starts (closed, enabled, not paused): the endpoints route
            // shows the latest any deliverer reported.
            for lane in lanes.values { publishStatus(lane) }
            await deliverUntilShutdown()
            commitQueue.finish()
            attempts.finish()
            // The delivery log's last records: written within a short bound, else dropped (and counted).
            let logDeadline = ContinuousClock.now + min(.seconds(2), drainTimeout)
            while !attempts.isDone, !Task.isCancelled, ContinuousClock.now < logDeadline {
                try? await Task.sleep(for: .milliseconds(20))
            }
            // The drain gave the writes their time; one still retrying (the log down) is cancelled, so its
            // delivery stays not done and goes out again after the restart, rather than holding the
            // shutdown of everything behind the deliverer.
            group.cancelAll()
        }
        for timer in timers.withLock({ timers in defer { timers.tasks = [:] }; return Array(timers.tasks.values) }) { timer.cancel() }
        await engine.close()
        await consumer.close()
        logger.info("deliverer stopped")
    }

    func deliverUntilShutdown() async {
        // Records are dispatched on the consumer's thread (dispatch never blocks); graceful shutdown
        // cancels the intake as a whole, and no dispatch runs once it returned.
        await cancelWhenGracefulShutdown { [self] in
            await consumer.consume { [self] record in dispatch(record) }
        }
        // Intake stopped: queued deliveries are left for the next owner; running ones may finish within
        // the drain bound. A slow endpoint's transfers are then aborted: their records are not done, so
        // they are delivered again after the restart (a webhook can arrive twice; never lost). Waiting for
        // them instead outlived the shutdown bound, and the service group killed the process.
        for lane in lanes.values { lane.stop() }
        tracker.abandon(lanes.values.reduce(0) { $0 + $1.dropWaiting() })
        let drainDeadline = ContinuousClock.now + drainTimeout
        while tracker.count > 0, !Task.isCancelled, ContinuousClock.now < drainDeadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        if tracker.count > 0 {
            logger.warning(
                "shutdown: aborting webhook transfers still running; they are delivered again after the restart",
                metadata: ["deliveries": "\(tracker.count)"])
        }
        engine.abortRunning()
        // What is left is the records of finished transfers being written to the log.
        let writeDeadline = ContinuousClock.now + min(.seconds(2), drainTimeout)
        while tracker.count > 0, !Task.isCancelled, ContinuousClock.now < writeDeadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Writes each finished attempt's record, concurrently, each in a child task.
    func runCommitter() async {
        await withDiscardingTaskGroup { group in
            for await commit in commits {
                group.addTask { [self] in await write(commit) }
            }
        }
    }

    // MARK: Intake

    func dispatch(_ record: ConsumedRecord) {
        tracker.begin()
        if let control = record.headers.first(named: DeliveryControl.header) {
            apply(control: control.stringValue, record)
            return
        }
        guard let delivery = DeliveryRecord(record) else {
            logger.error(
                "delivery record without endpoint or event id; dead-lettered",
                metadata: [LogKey.logTopic: "\(record.topic)", LogKey.logPartition: "\(record.partition)", LogKey.logOffset: "\(record.offset)"])
            let outgoing = OutgoingRecord(
                topic: topics.deadLetter, key: record.key, value: record.value,
                headers: record.headers + [
                    RecordHeader(name: DeliveryHeaderName.deadLetterReason, value: DeadLetterReason.malformed.rawValue),
                    RecordHeader(name: DeliveryHeaderName.deadLetteredAt, value: Timestamp.rfc3339(milliseconds: options.now())),
                ])
            counters.deadLettered(endpoint: "unknown", reason: .malformed)
            produceThenMarkDone(record, [outgoing])
            return
        }
        guard let lane = lanes[delivery.endpointID] else {
            logger.error("delivery for an endpoint not in the configuration; dead-lettered", metadata: ["endpoint": "\(delivery.endpointID)"])
            deadLetter(record, delivery, reason: .endpointUnknown, endpointLabel: "unknown")
            return
        }
        let now = options.now()
        let isNew = record.topic == topics.deliveries && delivery.replayedFrom == nil
        switch lane.admit(record, delivery, isNew: isNew, now: now, limit: maxPerEndpoint, canDefer: !policy.schedule.isEmpty) {
        case .start(let probe):
            start(record, delivery, lane, probe: probe)
        case .queued:
            armWake(lane)
        case .disabled:
            deadLetter(record, delivery, reason: .endpointDisabled, endpointLabel: lane.id)
        case .divert(let why, let evicted):
            divert(record, delivery, lane, why: why, now: now)
            for pending in evicted { divert(pending.record, pending.delivery, lane, why: why, now: now) }
        }
    }

    /// A control record (`DeliveryControl`): applied to this process's lane, then done. Nothing is sent.
    func apply(control: String?, _ record: ConsumedRecord) {
        let endpoint = record.headers.first(named: DeliveryHeaderName.endpoint)?.stringValue
        switch control.flatMap(DeliveryControl.init(rawValue:)) {
        case .enable:
            if let lane = endpoint.flatMap({ lanes[$0] }) {
                if lane.enable() { logger.info("endpoint enabled after its 410 Gone", metadata: ["endpoint": "\(lane.id)"]) }
                publishStatus(lane)
            } else {
                logger.warning("control record for an endpoint not in the configuration; ignored", metadata: ["endpoint": "\(endpoint ?? "-")"])
            }
        case nil:
            logger.warning("control record this version does not know; ignored (upgrade the deliverer)", metadata: ["control": "\(control ?? "-")"])
        }
        consumer.markDone(record)
        tracker.end()
    }

    /// Writes `lane`'s state to the delivery log, through its topic or directly (the endpoints route reads it).
    func publishStatus(_ lane: EndpointLane) {
        attempts.append(.status(lane.status(now: options.now())))
    }
}
