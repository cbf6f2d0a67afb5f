import Foundation
public import RelayCore

/// The loop every store history command runs (`import`, `recover`, `reconcile` of each store): it pages
/// through a store's list with the list's cursor, calls the store again after its rate limit, and keeps
/// the progress line. A command adds only what it does with each page.
///
/// **Rate limits.** A client tries a failed call three times within a second, and waits out a short
/// `Retry-After` itself (`withStoreRetries`). A call that still fails `.unavailable` (a 429 for a quota,
/// a `Retry-After` longer than a client waits, the store down) is called again after `pacing.waits`, or
/// after the store's `Retry-After` when that is longer; the progress line says so. Only once those waits
/// are spent does the command stop, telling the user to run it again: every command skips what it already
/// did, which is how a run is resumed after an interruption too.
public struct HistoryLoop: Sendable {
    /// How a command waits for a store that refuses or fails.
    public struct Pacing: Sendable {
        /// The waits before each new try of a failing call; their count is the number of tries.
        public var waits: [Duration]
        /// The longest `Retry-After` honoured; a store asking for longer ends the run.
        public var maximumRetryAfter: Duration
        /// How a wait is spent (tests record it instead of sleeping).
        public var sleep: @Sendable (Duration) async throws -> Void

        public init(waits: [Duration], maximumRetryAfter: Duration, sleep: @escaping @Sendable (Duration) async throws -> Void) {
            self.waits = waits
            self.maximumRetryAfter = maximumRetryAfter
            self.sleep = sleep
        }

        /// 5 s, 15 s, 30 s, 60 s and 120 s, so a store that is down or limits for about four minutes is
        /// outlasted; `Retry-After` honoured up to 10 minutes.
        public static let standard = Pacing(
            waits: [.seconds(5), .seconds(15), .seconds(30), .seconds(60), .seconds(120)], maximumRetryAfter: .seconds(600),
            sleep: { try await Task.sleep(for: $0) })
    }

    let pacing: Pacing
    let progress: @Sendable (String) -> Void
    let started = ContinuousClock.now

    public init(pacing: Pacing = .standard, progress: @escaping @Sendable (String) -> Void) {
        self.pacing = pacing
        self.progress = progress
    }

    /// `operation`, called again after the pacing's waits while it fails retriably. Any other failure, a
    /// `Retry-After` beyond the pacing's maximum, or the waits spent: its error.
    public func call<Value, Failure: StoreCallFailure>(_ what: String, _ operation: () async throws(Failure) -> Value) async throws(Failure) -> Value {
        var attempt = 0
        while true {
            do {
                return try await operation()
            } catch {
                guard error.isRetriable, attempt < pacing.waits.count else { throw error }
                if let asked = error.retryAfter, asked > pacing.maximumRetryAfter { throw error }
                let wait = max(pacing.waits[attempt], error.retryAfter ?? .zero)
                attempt += 1
                let reason = error.status == 429 ? "limits the rate" : "is unavailable"
                progress("the \(error.apiName) \(reason) (\(what)); trying again in \(Self.seconds(wait)) s (\(attempt) of \(pacing.waits.count))")
                let failure = error
                do { try await pacing.sleep(wait) } catch { throw failure }
            }
        }
    }

    /// Every page of a list, from the first: `fetch` gets the cursor and answers the page with
    /// the next cursor (nil after the last page); `each` does the command's work with it and its number. A
    /// failed page is called again as `call` does; `failure` turns what ends the run into the command's error.
    public func pages<Page, Failure: StoreCallFailure>(
        _ what: String, fetch: (String?) async throws(Failure) -> (page: Page, next: String?),
        failure: (Failure) -> CommandFailure, each: (Page, Int) async throws(CommandFailure) -> Void
    ) async throws(CommandFailure) {
        var cursor: String?
        var number = 0
        repeat {
            let answer: (page: Page, next: String?)
            do {
                answer = try await call(what) { () async throws(Failure) in try await fetch(cursor) }
            } catch {
                throw failure(error)
            }
            number += 1
            try await each(answer.page, number)
            cursor = answer.next
        } while cursor != nil
    }

    /// Every subscription of `store` in the application that the backend lists as active (or able to regain
    /// access), or written at or after `since`, page by page with the backend's cursor: `each` does the
    /// command's work with one, `page` runs after each page (its progress line).
    func stored(
        _ backend: HistoryBackend, store: Store, applicationId: Int, since: Int64?, each: (SubscriptionState) async throws(CommandFailure) -> Void,
        page: () -> Void
    ) async throws(CommandFailure) {
        var cursor: String?
        repeat {
            let answer = try await backend.subscriptions(store: store, applicationId: applicationId, activeOrChangedSince: since, cursor: cursor)
            cursor = answer.next
            for state in answer.states { try await each(state) }
            page()
        } while cursor != nil
    }

    /// A progress line: `done` of `total` (when known) `unit`, the rate, the time left, then `detail`.
    public func report(_ done: Int, of total: Int? = nil, _ unit: String, _ detail: String) {
        let elapsed = ContinuousClock.now - started
        let seconds = max(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18, 0.001)
        let rate = Double(done) / seconds
        var line = total.map { "\(done)/\($0) \(unit)" } ?? "\(done) \(unit)"
        line += " (\(Int(rate))/s"
        if let total, rate > 0, done < total { line += ", about \(Int((Double(total - done) / rate).rounded(.up))) s left" }
        line += ")"
        if !detail.isEmpty { line += ": " + detail }
        progress(line)
    }

    static func seconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds + (attoseconds > 0 ? 1 : 0)
    }
}

/// What `reconcile` found for one stored subscription (every store's check answers one).
enum ReconcileCheck {
    /// Not a subscription this store's reconcile compares: not counted.
    case skipped
    /// Stored for another environment than the store client's: counted apart, not checked.
    case otherEnvironment
    /// Could not be compared, and why; the run goes on.
    case failed(String)
    case inSync
    /// The records that bring the state to the store's (appended in one batch), and what to report.
    case corrected([OutgoingRecord], ReconcileCorrection)
}

extension HistoryLoop {
    /// `reconcile` of every store: each stored subscription of `store` (`stored`) is compared by `check`,
    /// which gets the corrections so far (for the message of a failure that ends the run); corrections are
    /// appended to `topic`, counted, passed to `corrected` and reported after each page.
    func reconcile(
        _ backend: HistoryBackend, store: Store, applicationId: Int, since: Int64?, producer: any RecordProducer, topic: String,
        corrected: @Sendable (ReconcileCorrection) -> Void,
        check: (SubscriptionState, _ correctedSoFar: Int) async throws(CommandFailure) -> ReconcileCheck
    ) async throws(CommandFailure) -> ReconcileSummary {
        var summary = ReconcileSummary()
        try await stored(backend, store: store, applicationId: applicationId, since: since) { state throws(CommandFailure) in
            switch try await check(state, summary.corrections.count) {
            case .skipped:
                return
            case .otherEnvironment:
                summary.otherEnvironment += 1
            case .failed(let why):
                summary.checked += 1
                summary.failures.append("\(state.originalTransactionId): \(why)")
            case .inSync:
                summary.checked += 1
                summary.inSync += 1
            case .corrected(let records, let correction):
                summary.checked += 1
                try await HistoryRun.append(records, producer: producer, topic: topic, rerun: HistoryRun.reconcileAgain)
                summary.corrections.append(correction)
                corrected(correction)
            }
        } page: {
            report(summary.checked, "subscriptions checked", "\(summary.corrections.count) corrected, \(summary.failures.count) failed")
        }
        return summary
    }
}
