import CoreMetrics
import Logging
import RelayCore
import RelayHTTPClient

/// Moving deliveries through their endpoint's lane: starting an attempt, freeing its slot, a key's next
/// delivery, deferral to a retry topic, and the timer for what an endpoint's rate or pause holds back.
extension Deliverer {
    /// Queued deliveries of `lane` wait for time (its `rateLimit`, or a `Retry-After`): a timer starts them
    /// once they may go.
    func armWake(_ lane: EndpointLane) {
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
    func startReady(_ lane: EndpointLane) {
        while let next = lane.takeReady(now: options.now(), limit: maxPerEndpoint) {
            startUnlessDisabled(next, lane, probe: next.probe, freeingItsSlot: true)
        }
        armWake(lane)
    }

    /// Sends a delivery on to the retry step it is at (the first, for a new one) without an attempt.
    func divert(_ record: ConsumedRecord, _ delivery: DeliveryRecord, _ lane: EndpointLane, why: String, now: Int64) {
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
    func advance(_ lane: EndpointLane, after record: ConsumedRecord) {
        let now = options.now()
        guard let (next, admission) = lane.keyFinished(record, now: now, limit: maxPerEndpoint, canDefer: !policy.schedule.isEmpty) else { return }
        switch admission {
        case .start(let probe):
            startUnlessDisabled(next, lane, probe: probe, freeingItsSlot: true)
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
    func start(_ record: ConsumedRecord, _ delivery: DeliveryRecord, _ lane: EndpointLane, probe: Bool) {
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
    func finishSlot(_ lane: EndpointLane) {
        while let next = lane.release(now: options.now()) {
            // Dead-lettered unsent (a 410 meanwhile): `release` handed its slot on; look for the next.
            if startUnlessDisabled(next, lane, probe: next.probe, freeingItsSlot: false) { return }
        }
        armWake(lane)
    }

    /// Starts `next`, which holds one of the lane's slots; or, when the endpoint answered 410 meanwhile,
    /// dead-letters it unsent (a replay still goes), first freeing its slot when `freeingItsSlot` (false when
    /// the caller's `release` loop hands the slot on). Returns whether it started.
    @discardableResult
    func startUnlessDisabled(_ next: EndpointLane.Pending, _ lane: EndpointLane, probe: Bool, freeingItsSlot: Bool) -> Bool {
        guard lane.isDisabled && next.delivery.replayedFrom == nil else {
            start(next.record, next.delivery, lane, probe: probe)
            return true
        }
        if probe { lane.abandonProbe(now: options.now()) }
        if freeingItsSlot { finishSlot(lane) }
        deadLetter(next.record, next.delivery, reason: .endpointDisabled, endpointLabel: lane.id)
        return false
    }
}
