import RelayCore
import RelayHTTPClient

/// What becomes of one delivery attempt, decided from its result alone: no lane, no log, no clock of
/// its own. The deliverer applies it (counters, the endpoint's breaker, the record it produces).
enum DeliveryOutcome: Sendable {
    /// Ended by a shutdown past its drain bound: not an attempt; the record stays not done.
    case aborted
    /// A 2xx.
    case delivered
    /// 410 Gone: dead-lettered (`endpoint_gone`) and the endpoint disabled.
    case gone(DeliveryRecord)
    /// Tried again from retry step `topicStep`'s topic, due at `dueAt` (Unix milliseconds).
    case retry(DeliveryRecord, topicStep: Int, dueAt: Int64)
    /// No retry left: dead-lettered (`retries_exhausted`).
    case exhausted(DeliveryRecord)
    /// A 429 or 503 with `Retry-After`: the endpoint pauses for `waitMilliseconds`; not an attempt spent.
    case throttled(DeliveryRecord, waitMilliseconds: Int64)

    /// - Parameters:
    ///   - attempt: the delivery as sent (its `attempts` counts this attempt).
    ///   - now: when the result arrived, Unix milliseconds.
    ///   - random: uniform in 0..<1, for the retry's jitter; asked only when a retry is considered.
    ///   - pause: the bounds of a `Retry-After` pause (milliseconds).
    static func classify(
        _ result: HTTPTransferResult, attempt: DeliveryRecord, policy: RetryPolicy, now: Int64, random: () -> Double,
        pause: ClosedRange<Int64> = 1_000...300_000
    ) -> DeliveryOutcome {
        if result.error?.kind == .aborted { return .aborted }
        if let response = result.response, (200..<300).contains(response.status) { return .delivered }
        var failed = attempt
        if let response = result.response {
            failed.lastStatus = response.status
            failed.lastError = (300..<400).contains(response.status) ? "HTTP \(response.status) (redirects are not followed)" : "HTTP \(response.status)"
            failed.lastResponse = DeliveryRecord.truncatedResponse(response.body)
        } else {
            failed.lastStatus = nil
            failed.lastError = result.error.map { "\($0.kind.rawValue): \($0.message)" } ?? "no response"
            failed.lastResponse = nil
        }
        if result.response?.status == 410 { return .gone(failed) }
        let retryAfter = RetryAfter.milliseconds(result.response?.header("retry-after"), now: now)
        // A receiver asking for time spends no attempt, but only within the schedule's span from the first
        // attempt: one that asks forever is then failing like any other and ends in the dead-letter topic.
        if let retryAfter, let status = result.response?.status, status == 429 || status == 503,
            now - (attempt.firstAttemptAt ?? now) < policy.spanMilliseconds
        {
            return .throttled(failed, waitMilliseconds: min(max(retryAfter, pause.lowerBound), pause.upperBound))
        }
        let failure = RetryPolicy.Failure(
            status: result.response?.status, timedOut: result.error?.kind == .timeout, retryAfterMilliseconds: retryAfter)
        switch policy.next(afterAttempt: failed.attempts, failure: failure, random: random()) {
        case .retry(let step, let wait):
            return .retry(failed, topicStep: policy.topicStep(forWait: wait, from: step), dueAt: now + wait)
        case .deadLetter:
            return .exhausted(failed)
        }
    }
}
