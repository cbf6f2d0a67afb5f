import CoreMetrics
import Logging
import RelayCore
import RelayHTTPClient

/// What becomes of a finished attempt, and the writes that record it.
extension Deliverer {
    // Outcomes run on the engine's thread: nothing here blocks.

    /// - Parameter unsent: the delivery as it was before this attempt (a throttled attempt is not spent).
    func completed(
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
            attempts.append(.attempt(logEntry(record, answered, result, outcome: .throttled, startedAt: startedAt, now: now, nextAttemptAt: now + wait)))
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
            attempts.append(.attempt(logEntry(record, attempt, result, outcome: .succeeded, startedAt: startedAt, now: now)))
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
    func logEntry(
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

    func deadLetter(
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
    func produceThenMarkDone(_ record: ConsumedRecord, _ outgoing: [OutgoingRecord], logged: DeliveryAttempt? = nil) {
        if case .terminated = commitQueue.yield(Commit(record: record, outgoing: outgoing, logged: logged)) {
            // The committer has ended (shutdown): the record stays not done.
            tracker.end()
        }
    }

    func write(_ commit: Commit) async {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
        while true {
            do {
                _ = try await producer.produce(commit.outgoing)
                consumer.markDone(commit.record)
                if let logged = commit.logged { attempts.append(.attempt(logged)) }
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
