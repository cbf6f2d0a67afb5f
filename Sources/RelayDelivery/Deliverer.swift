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
    private let consumer: any RecordConsumer
    private let producer: any RecordProducer
    private let engine: HTTPTransferEngine
    private let lanes: [String: EndpointLane]
    private let topics: RelayConfiguration.Topics
    private let policy: RetryPolicy
    private let options: DelivererOptions
    private let timeout: Duration
    private let connectTimeout: Duration
    /// How long the deliverer's turn in a graceful shutdown waits for running transfers before aborting
    /// them: half of `shutdownTimeout`, leaving the rest to the worker and the log behind it. (The
    /// services stop one after another; the HTTP server before it may have used up to `ingest.ackTimeout`.)
    private let drainTimeout: Duration
    private let maxPerEndpoint: Int
    private let logger: Logger
    private let counters: DeliveryCounters
    private let tracker = InFlightTracker()
    /// The records to write for finished attempts (retry, dead letter), in the order decided; the
    /// committer in `run` writes them, each then marking its delivery done.
    private let commits: AsyncStream<Commit>
    private let commitQueue: AsyncStream<Commit>.Continuation

    private struct Commit: Sendable {
        var record: ConsumedRecord
        var outgoing: [OutgoingRecord]
        /// The delivery log's record of this outcome, handed to `attempts` once `outgoing` is written: never in
        /// the same produce, so the log's topic can never hold back (or repeat) a delivery.
        var logged: DeliveryAttempt?
    }
    /// The delivery log's records of successful attempts, written in batches.
    private let attempts: AttemptWriter
    /// The timers armed for endpoints held back by their rate or a pause (`armWake`), cancelled when `run` ends.
    private let timers = Mutex<(next: UInt64, tasks: [UInt64: Task<Void, Never>])>((0, [:]))

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

    /// The deliverer of `configuration`'s sections (`Settings`).
    public convenience init(
        configuration: RelayConfiguration, consumer: any RecordConsumer, producer: any RecordProducer, logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory, options: DelivererOptions = .init()
    ) throws(DelivererSetupError) {
        try self.init(settings: Settings(configuration), consumer: consumer, producer: producer, logger: logger, metrics: metrics, options: options)
    }

    public init(
        settings: Settings, consumer: any RecordConsumer, producer: any RecordProducer, logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory, options: DelivererOptions = .init()
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
        self.attempts = AttemptWriter(producer: producer, logger: logger, metrics: metrics)
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

    private func deliverUntilShutdown() async {
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
    private func runCommitter() async {
        await withDiscardingTaskGroup { group in
            for await commit in commits {
                group.addTask { [self] in await write(commit) }
            }
        }
    }

    // MARK: Intake

    private func dispatch(_ record: ConsumedRecord) {
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
    private func apply(control: String?, _ record: ConsumedRecord) {
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

    /// Writes `lane`'s state to the delivery log's topic (the endpoints route reads it).
    private func publishStatus(_ lane: EndpointLane) {
        attempts.append(lane.status(now: options.now()).record(topic: topics.attempts))
    }

    /// Queued deliveries of `lane` wait for time (its `rateLimit`, or a `Retry-After`): a timer starts them
    /// once they may go.
    private func armWake(_ lane: EndpointLane) {
        guard let at = lane.wakeToArm(now: options.now(), limit: maxPerEndpoint) else { return }
        let sleep = options.sleepUntil
        timers.withLock { state in
            state.next += 1
            let id = state.next
            state.tasks[id] = Task { [self] in
                await sleep(at)
                self.timers.withLock { _ = $0.tasks.removeValue(forKey: id) }
                guard !Task.isCancelled else { return }
                lane.woke(at: at)
                startReady(lane)
            }
        }
    }

    /// Starts what `lane` may start now, then arms its timer for the rest.
    private func startReady(_ lane: EndpointLane) {
        while let next = lane.takeReady(now: options.now(), limit: maxPerEndpoint) {
            if lane.isDisabled && next.delivery.replayedFrom == nil {
                if next.probe { lane.abandonProbe(now: options.now()) }
                finishSlot(lane)
                deadLetter(next.record, next.delivery, reason: .endpointDisabled, endpointLabel: lane.id)
                continue
            }
            start(next.record, next.delivery, lane, probe: next.probe)
        }
        armWake(lane)
    }

    /// Sends a delivery on to the retry step it is at (the first, for a new one) without an attempt.
    private func divert(_ record: ConsumedRecord, _ delivery: DeliveryRecord, _ lane: EndpointLane, why: String, now: Int64) {
        if why == EndpointLane.throttled {
            // Held back by the endpoint's rate or pause, not by its failures: back once it may be sent to (at
            // least a second), from the first retry topic that holds that wait, whatever step it was at.
            let wait = max(1_000, lane.nextStart(now: now) - now)
            lane.counters.deferred.increment()
            logger.debug("delivery deferred", metadata: ["endpoint": "\(lane.id)", "reason": "\(why)"])
            produceThenMarkDone(record, [delivery.retryRecord(topic: topics.retry(step: policy.topicStep(forWait: wait, from: 1)), due: now + wait)])
            advance(lane, after: record)
            return
        }
        let step = max(1, delivery.attempts)
        guard case .retry(_, let waitMilliseconds) = policy.next(afterAttempt: step, failure: .init(status: nil), random: options.random()) else {
            deadLetter(record, delivery, reason: .retriesExhausted, endpointLabel: lane.id)
            return
        }
        lane.counters.deferred.increment()
        logger.debug("delivery deferred", metadata: ["endpoint": "\(lane.id)", "reason": "\(why)"])
        produceThenMarkDone(record, [delivery.retryRecord(topic: topics.retry(step: step), due: now + waitMilliseconds)])
        // Moved to a retry topic: the subscription's next delivery may go (and overtake it).
        advance(lane, after: record)
    }

    /// `record` (its key's head) has its outcome: the subscription's next delivery to this endpoint
    /// starts, or waits for a slot. Nothing when it was not a head or no delivery waits behind it.
    private func advance(_ lane: EndpointLane, after record: ConsumedRecord) {
        let now = options.now()
        guard let (next, admission) = lane.keyFinished(record, now: now, limit: maxPerEndpoint, canDefer: !policy.schedule.isEmpty) else { return }
        switch admission {
        case .start(let probe):
            // The endpoint answered 410 meanwhile: as for queued deliveries, dead-lettered unsent (but replays).
            if lane.isDisabled && next.delivery.replayedFrom == nil {
                if probe { lane.abandonProbe(now: now) }
                finishSlot(lane)
                deadLetter(next.record, next.delivery, reason: .endpointDisabled, endpointLabel: lane.id)
                return
            }
            start(next.record, next.delivery, lane, probe: probe)
        case .queued:
            armWake(lane)
        case .disabled:
            deadLetter(next.record, next.delivery, reason: .endpointDisabled, endpointLabel: lane.id)
        case .divert(let why, let evicted):
            // An open breaker or a stalled endpoint: to the retry topic unsent, like a delivery just read
            // (and the key moves on behind it).
            divert(next.record, next.delivery, lane, why: why, now: now)
            for pending in evicted { divert(pending.record, pending.delivery, lane, why: why, now: now) }
        }
    }

    /// Sends one attempt. The lane already counted it in flight.
    private func start(_ record: ConsumedRecord, _ delivery: DeliveryRecord, _ lane: EndpointLane, probe: Bool) {
        // Taken away by a rebalance: the partition's new owner delivers it.
        guard consumer.isAssigned(record) else {
            if probe { lane.abandonProbe(now: options.now()) }
            finishSlot(lane)
            tracker.end()
            // The key's next delivery: checked the same way when it starts (one of the same partition is
            // let go too).
            advance(lane, after: record)
            return
        }
        var attempt = delivery
        let now = options.now()
        attempt.attempts += 1
        attempt.firstAttemptAt = attempt.firstAttemptAt ?? now
        attempt.lastAttemptAt = now
        var headers = lane.signer.headers(id: delivery.eventID, timestamp: now / 1000, body: delivery.body)
        headers.append(("Content-Type", "application/json"))
        let request = HTTPTransferRequest(url: lane.url, headers: headers, body: delivery.body, connectTimeout: connectTimeout, timeout: timeout)
        engine.submit(request) { [self, attempt] result in
            completed(record, attempt, lane, result, startedAt: now, unsent: EndpointLane.Pending(record: record, delivery: delivery, probe: probe))
        }
    }

    /// A slot of `lane` is free: start the next queued delivery in it, or release it.
    private func finishSlot(_ lane: EndpointLane) {
        while let next = lane.release(now: options.now()) {
            // The endpoint answered 410 meanwhile: queued deliveries (but replays) are dead-lettered unsent.
            if lane.isDisabled && next.delivery.replayedFrom == nil {
                if next.probe { lane.abandonProbe(now: options.now()) }
                deadLetter(next.record, next.delivery, reason: .endpointDisabled, endpointLabel: lane.id)
                continue
            }
            start(next.record, next.delivery, lane, probe: next.probe)
            return
        }
        armWake(lane)
    }

    // MARK: Outcomes (on the engine's thread: nothing here blocks)

    /// - Parameter unsent: the delivery as it was before this attempt (a throttled attempt is not spent).
    private func completed(
        _ record: ConsumedRecord, _ attempt: DeliveryRecord, _ lane: EndpointLane, _ result: HTTPTransferResult, startedAt: Int64, unsent: EndpointLane.Pending
    ) {
        let now = options.now()
        let outcome = DeliveryOutcome.classify(
            result, attempt: attempt, policy: policy, now: now, random: options.random, pause: options.minimumPause...options.maximumPause)
        // Aborted by shutdown: not an attempt. The record stays not done and is delivered after the restart.
        if case .aborted = outcome {
            tracker.end()
            return
        }
        lane.counters.duration.recordMilliseconds(max(0, now - startedAt))
        if case .throttled(let answered, let wait) = outcome {
            // Slow down, not a failure: the endpoint pauses (this lane only), the attempt is not spent and the
            // breaker does not count it; the delivery goes first once the pause is over.
            lane.counters.throttled.increment()
            attempts.append(
                logEntry(record, answered, result, outcome: .throttled, startedAt: startedAt, now: now, nextAttemptAt: now + wait)
                    .record(topic: topics.attempts))
            logger.info("endpoint asked to slow down; paused", metadata: ["endpoint": "\(lane.id)", "pause.ms": "\(wait)"])
            if lane.throttle(unsent, until: now + wait, now: now) {
                publishStatus(lane)
                armWake(lane)
            } else {
                // Shutting down: not done, delivered after the restart.
                tracker.end()
            }
            return
        }
        finishSlot(lane)
        let failed: DeliveryRecord
        switch outcome {
        case .aborted, .throttled:
            return
        case .delivered:
            attempts.append(logEntry(record, attempt, result, outcome: .succeeded, startedAt: startedAt, now: now).record(topic: topics.attempts))
            let wasDisabled = attempt.replayedFrom != nil && lane.isDisabled
            if lane.record(success: true, replayed: attempt.replayedFrom != nil, now: now) == .closed {
                logger.info("endpoint recovered; circuit closed", metadata: ["endpoint": "\(lane.id)"])
                publishStatus(lane)
            } else if wasDisabled {
                publishStatus(lane)
            }
            lane.counters.delivered.increment()
            consumer.markDone(record)
            tracker.end()
            advance(lane, after: record)
            return
        case .gone(let delivery), .retry(let delivery, _, _), .exhausted(let delivery):
            failed = delivery
        }
        lane.counters.failed.increment()
        if lane.record(success: false, now: now) == .opened {
            logger.warning("endpoint keeps failing; circuit opened", metadata: ["endpoint": "\(lane.id)", LogKey.error: "\(failed.lastError ?? "")"])
            publishStatus(lane)
        }
        logger.debug(
            "delivery attempt failed",
            metadata: ["endpoint": "\(lane.id)", "event.id": "\(attempt.eventID)", "attempt": "\(attempt.attempts)", LogKey.error: "\(failed.lastError ?? "")"])
        switch outcome {
        case .gone:
            if lane.disable() {
                logger.warning(
                    "endpoint answered 410 Gone; disabled until enabled, a successful replay or resend, or a restart", metadata: ["endpoint": "\(lane.id)"])
                publishStatus(lane)
            }
            deadLetter(
                record, failed, reason: .endpointGone, endpointLabel: lane.id,
                attempt: logEntry(record, failed, result, outcome: .dead, startedAt: startedAt, now: now, reason: .endpointGone))
        case .retry(_, let topicStep, let dueAt):
            lane.counters.retried.increment()
            let entry = logEntry(record, failed, result, outcome: .retrying, startedAt: startedAt, now: now, nextAttemptAt: dueAt)
            produceThenMarkDone(record, [failed.retryRecord(topic: topics.retry(step: topicStep), due: dueAt)], logged: entry)
            // Moved to a retry topic: the subscription's later deliveries go ahead of it (docs/delivery.md
            // says why; `data.sequence` lets receivers drop a stale one).
            advance(lane, after: record)
        case .exhausted:
            deadLetter(
                record, failed, reason: .retriesExhausted, endpointLabel: lane.id,
                attempt: logEntry(record, failed, result, outcome: .dead, startedAt: startedAt, now: now, reason: .retriesExhausted))
        case .aborted, .delivered, .throttled:
            break
        }
    }

    /// The delivery log's record of an attempt that finished (`result`), or of a delivery dead-lettered unsent
    /// (`result` nil: its endpoint disabled by a 410).
    private func logEntry(
        _ record: ConsumedRecord, _ delivery: DeliveryRecord, _ result: HTTPTransferResult?, outcome: DeliveryAttempt.Outcome, startedAt: Int64, now: Int64,
        nextAttemptAt: Int64? = nil, reason: DeadLetterReason? = nil
    ) -> DeliveryAttempt {
        let key = record.key.map { String(decoding: $0, as: UTF8.self) }
        let prefix = delivery.endpointID + ":"
        let subject = key.flatMap { $0.hasPrefix(prefix) ? String($0.dropFirst(prefix.count)) : nil }
        return DeliveryAttempt(
            app: delivery.app, endpoint: delivery.endpointID, eventId: delivery.eventID, eventType: delivery.eventType, subject: subject,
            attempt: delivery.attempts, outcome: outcome, httpStatus: result?.response?.status, durationMs: result == nil ? nil : max(0, now - startedAt),
            error: outcome == .succeeded ? nil : delivery.lastError.map { String($0.prefix(DeliveryAttempt.maximumErrorLength)) }, startedAt: startedAt, finishedAt: now, replayedFrom: delivery.replayedFrom,
            nextAttemptAt: nextAttemptAt, deadLetterReason: reason?.rawValue)
    }

    private func deadLetter(
        _ record: ConsumedRecord, _ delivery: DeliveryRecord, reason: DeadLetterReason, endpointLabel: String, attempt: DeliveryAttempt? = nil
    ) {
        counters.deadLettered(endpoint: endpointLabel, reason: reason)
        logger.info(
            "delivery dead-lettered",
            metadata: [
                "endpoint": "\(delivery.endpointID)", "event.id": "\(delivery.eventID)", "reason": "\(reason.rawValue)",
                "attempts": "\(delivery.attempts)",
            ])
        let now = options.now()
        // Dead-lettered unsent (a disabled or unknown endpoint, no retry left for a deferred one): the log says so too.
        var entry = attempt
        if entry == nil {
            var unsent = delivery
            unsent.lastError =
                switch reason {
                case .endpointDisabled: "not sent: the endpoint answered 410 Gone before"
                case .endpointUnknown: "not sent: the endpoint is not configured"
                default: "not sent: deferred with no retry left"
                }
            entry = logEntry(record, unsent, nil, outcome: .dead, startedAt: now, now: now, reason: reason)
        }
        produceThenMarkDone(record, [delivery.deadLetterRecord(topic: topics.deadLetter, reason: reason, at: now)], logged: entry)
        if let lane = lanes[delivery.endpointID] { advance(lane, after: record) }
    }

    /// Produces `outgoing` (retrying while the log cannot take it) and then marks `record` done. On
    /// shutdown past its bound the record stays not done, and is delivered again after a restart.
    private func produceThenMarkDone(_ record: ConsumedRecord, _ outgoing: [OutgoingRecord], logged: DeliveryAttempt? = nil) {
        if case .terminated = commitQueue.yield(Commit(record: record, outgoing: outgoing, logged: logged)) {
            // The committer has ended (shutdown): the record stays not done.
            tracker.end()
        }
    }

    private func write(_ commit: Commit) async {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
        while true {
            do {
                _ = try await producer.produce(commit.outgoing)
                consumer.markDone(commit.record)
                if let logged = commit.logged { attempts.append(logged.record(topic: topics.attempts)) }
                break
            } catch {
                if Task.isCancelled || !consumer.isAssigned(commit.record) { break }
                logger.warning(
                    "could not produce the delivery's next record; retrying",
                    metadata: [LogKey.logTopic: "\(commit.outgoing.first?.topic ?? "-")", LogKey.error: "\(error)"])
                do { try await Task.sleep(for: backoff.next()) } catch { break }
            }
        }
        tracker.end()
    }
}
