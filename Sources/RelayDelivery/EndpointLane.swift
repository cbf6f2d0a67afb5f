import CoreMetrics
import DequeModule
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
import ServiceLifecycle
import Synchronization

/// One endpoint's signer, limits, queue and breaker, and the order of each subscription's deliveries:
/// the deliveries of one record key (`<endpoint>:<subject>`, one subscription) go out one at a time, in
/// the order they were read (log order, per partition), each starting once the one before it has an
/// outcome (delivered, moved to a retry topic, or dead-lettered). Different keys go out concurrently.
final class EndpointLane: Sendable {
    struct Pending: Sendable {
        var record: ConsumedRecord
        var delivery: DeliveryRecord
        /// This delivery is the open breaker's probe.
        var probe = false
        /// From `relay.deliveries` and not a replay: held back by an open breaker (see `admit`).
        var isNew = false
    }

    /// A record's place in the log: which delivery is a key's head.
    struct Position: Hashable, Sendable {
        var topic: String
        var partition: Int32
        var offset: Int64

        init(_ record: ConsumedRecord) {
            topic = record.topic
            partition = record.partition
            offset = record.offset
        }
    }

    /// A key's head (started, or waiting for a slot) and the deliveries read after it, in order.
    struct KeyQueue: Sendable {
        var head: Position
        var followers = Deque<Pending>()
    }

    enum Admission: Sendable {
        /// Start it now; `probe` when it is the breaker's probe.
        case start(probe: Bool)
        case queued, disabled
        /// Send this delivery (and the queued ones given) on to the retry topic unsent.
        case divert(String, evicted: [Pending])
    }

    /// An endpoint at its limit with no transfer finished for this long is stalled: beyond a queue of
    /// `limit`, its deliveries are deferred so they do not take the deliverer's whole in-flight budget.
    static let stallMilliseconds: Int64 = 1000

    private struct State {
        var inFlight = 0
        var waiting = Deque<Pending>()
        var breaker: CircuitBreaker
        var disabled = false
        var stopped = false
        /// When a transfer last finished, or the lane last went from idle to busy.
        var lastProgressAt: Int64 = 0
        /// The keys with a delivery under way; a key's next delivery waits here, using no slot.
        var keys: [[UInt8]: KeyQueue] = [:]
        /// No attempt starts before this (Unix ms): the endpoint answered 429 or 503 with `Retry-After`.
        var resumeAt: Int64 = 0
        /// `rateLimit`'s bucket: attempts that may start now (at most one second's worth), refilled at `rate`.
        var tokens: Double = 0
        var refilledAt: Int64 = 0
        /// The timer armed to start waiting deliveries once the endpoint may be sent to again.
        var wakeAt: Int64?

        /// Whether an attempt may start now as far as time goes (the pause and the rate), refilling the bucket.
        mutating func mayStart(now: Int64, rate: Double?) -> Bool {
            guard now >= resumeAt else { return false }
            guard let rate else { return true }
            tokens = min(max(1, rate), tokens + Double(max(0, now - refilledAt)) * rate / 1000)
            refilledAt = now
            return tokens >= 1
        }

        /// When `mayStart` will next be true (Unix ms).
        func startableAt(now: Int64, rate: Double?) -> Int64 {
            var at = max(now, resumeAt)
            if let rate, tokens < 1 { at = max(at, refilledAt + Int64(((1 - tokens) * 1000 / rate).rounded(.up))) }
            return at
        }

        /// Counts one attempt against the rate.
        mutating func take(rate: Double?) {
            if rate != nil { tokens -= 1 }
        }
    }

    let id: String
    let app: String
    let url: String
    let signer: WebhookSigner
    let counters: EndpointCounters
    /// `rateLimit`, attempts per second; nil: none.
    let rate: Double?
    private let state: Mutex<State>

    init(id: String, app: String = "", url: String, signer: WebhookSigner, breaker: CircuitBreaker, rate: Double? = nil, metrics: any MetricsFactory) {
        self.id = id
        self.app = app
        self.url = url
        self.signer = signer
        self.rate = rate
        self.counters = EndpointCounters(endpoint: id, metrics: metrics)
        var initial = State(breaker: breaker)
        initial.tokens = max(1, rate ?? 1)
        self.state = Mutex(initial)
    }

    /// Whether `delivery` may start now, waits for a slot (or behind an earlier delivery of its key), or
    /// goes elsewhere.
    /// - Parameter isNew: the record comes from `relay.deliveries` (not a retry topic, where due retries
    ///   and deferred deliveries wait) and is not a replay: only those are held back by an open breaker.
    func admit(_ record: ConsumedRecord, _ delivery: DeliveryRecord, isNew: Bool, now: Int64, limit: Int, canDefer: Bool) -> Admission {
        let (admission, circuitOpen) = state.withLock { state -> (Admission, Bool) in
            if state.disabled && delivery.replayedFrom == nil { return (.disabled, true) }
            // Behind an earlier delivery of the same subscription: it goes when that one has an outcome.
            if let key = record.key, state.keys[key] != nil {
                state.keys[key]?.followers.append(Pending(record: record, delivery: delivery, isNew: isNew))
                return (.queued, state.breaker.isOpen)
            }
            let result = place(
                Pending(record: record, delivery: delivery, isNew: isNew), isNew: isNew, now: now, limit: limit, canDefer: canDefer, in: &state)
            // Started or waiting for a slot: the key's head until it has an outcome. (A diverted or
            // dead-lettered delivery holds nothing back.)
            switch result.0 {
            case .start, .queued: if let key = record.key { state.keys[key] = KeyQueue(head: Position(record)) }
            case .disabled, .divert: break
            }
            return result
        }
        counters.circuitOpen.record(circuitOpen ? 1 : 0)
        return admission
    }

    /// A key's head has its outcome (`record`): the key's next delivery becomes its head and is placed as
    /// a delivery just read would be (the breaker and the stall rule apply): returned with its admission,
    /// `.start`, `.queued` or `.divert` (its key then moves on once it is diverted). Nil when none waits
    /// (the key is free), when the lane stopped (the waiting ones are for `dropWaiting` to count), or when
    /// `record` is not its key's head (dead-lettered or diverted as it was read).
    func keyFinished(_ record: ConsumedRecord, now: Int64, limit: Int, canDefer: Bool) -> (next: Pending, admission: Admission)? {
        let (result, circuitOpen) = state.withLock { state -> ((next: Pending, admission: Admission)?, Bool) in
            guard !state.stopped, let key = record.key, state.keys[key]?.head == Position(record) else { return (nil, state.breaker.isOpen) }
            guard let next = state.keys[key]?.followers.popFirst() else {
                state.keys[key] = nil
                return (nil, state.breaker.isOpen)
            }
            state.keys[key]?.head = Position(next.record)
            let (admission, open) = place(next, isNew: next.isNew, now: now, limit: limit, canDefer: canDefer, in: &state)
            return ((next, admission), open)
        }
        counters.circuitOpen.record(circuitOpen ? 1 : 0)
        return result
    }

    /// Starts, queues or diverts a delivery that is its key's head (or has no key).
    private func place(_ pending: Pending, isNew: Bool, now: Int64, limit: Int, canDefer: Bool, in state: inout State) -> (Admission, Bool) {
        var probing = false
        if isNew {
            switch state.breaker.admitNew(now: now) {
            case .pass: break
            case .probe: probing = true
            case .divert: return (.divert("circuit open", evicted: []), true)
            }
        }
        let timely = state.mayStart(now: now, rate: rate)
        if state.inFlight < limit && timely && state.waiting.isEmpty {
            if state.inFlight == 0 { state.lastProgressAt = now }
            state.inFlight += 1
            state.take(rate: rate)
            return (.start(probe: probing), state.breaker.isOpen)
        }
        // A busy endpoint that keeps finishing transfers queues without bound (the consumer's
        // back-pressure bounds it); a stalled one keeps a queue of `limit` and defers the rest, and so does
        // one held back by its rate or a `Retry-After` (a queue of two seconds' worth of its rate, at least
        // `limit`).
        let stalled = state.inFlight >= limit && now - state.lastProgressAt > Self.stallMilliseconds
        let bound = timely ? limit : max(limit, Int(((rate ?? 0) * 2).rounded(.up)))
        if !(stalled || !timely) || state.waiting.count < bound || !canDefer {
            var queued = pending
            queued.probe = probing
            state.waiting.append(queued)
            return (.queued, state.breaker.isOpen)
        }
        if probing { state.breaker.probeAbandoned(now: now) }
        var evicted: [Pending] = []
        while state.waiting.count > bound, let last = state.waiting.popLast() {
            if last.probe { state.breaker.probeAbandoned(now: now) }
            evicted.append(last)
        }
        return (.divert(timely ? "endpoint stalled" : Self.throttled, evicted: evicted.reversed()), state.breaker.isOpen)
    }

    /// A transfer finished: the next queued delivery takes its slot (returned), or the slot is freed (and
    /// when the rate or a pause holds the queue back, `wakeAt` says when to look again).
    func release(now: Int64) -> Pending? {
        state.withLock { state in
            state.lastProgressAt = now
            if !state.stopped, !state.waiting.isEmpty, state.mayStart(now: now, rate: rate) {
                state.take(rate: rate)
                return state.waiting.popFirst()
            }
            state.inFlight -= 1
            return nil
        }
    }

    /// The next queued delivery that may start now, counted in flight; nil when none waits, the slots are
    /// taken, or the rate or a pause holds it back.
    func takeReady(now: Int64, limit: Int) -> Pending? {
        state.withLock { state in
            guard !state.stopped, !state.waiting.isEmpty, state.inFlight < limit, state.mayStart(now: now, rate: rate) else { return nil }
            if state.inFlight == 0 { state.lastProgressAt = now }
            state.inFlight += 1
            state.take(rate: rate)
            return state.waiting.popFirst()
        }
    }

    /// When queued deliveries wait for time (the rate or a pause), not for a slot, and no timer is armed
    /// for then: the time to arm one for (recorded as armed). Nil otherwise.
    func wakeToArm(now: Int64, limit: Int) -> Int64? {
        state.withLock { state in
            guard !state.stopped, !state.waiting.isEmpty, state.inFlight < limit else { return nil }
            let at = state.startableAt(now: now, rate: rate)
            if let armed = state.wakeAt, armed <= at, armed > now { return nil }
            state.wakeAt = at
            return at
        }
    }

    /// The timer armed for `at` fired.
    func woke(at: Int64) {
        state.withLock { state in
            if state.wakeAt == at { state.wakeAt = nil }
        }
    }

    /// The endpoint answered 429 or 503 with `Retry-After`: no attempt starts before `until`, and `pending`
    /// (the delivery that got the answer, its attempt not spent) goes first once it may. Its slot is freed.
    /// False when the lane has stopped (shutdown): the delivery stays not done.
    func throttle(_ pending: Pending, until: Int64, now: Int64) -> Bool {
        state.withLock { state in
            state.inFlight -= 1
            state.lastProgressAt = now
            state.resumeAt = max(state.resumeAt, until)
            guard !state.stopped else { return false }
            state.waiting.prepend(pending)
            return true
        }
    }

    /// Why a delivery is diverted while the endpoint's rate or a `Retry-After` holds it back.
    static let throttled = "endpoint throttled"

    /// When the endpoint may be sent to next as far as time goes (its pause and its rate), Unix ms.
    func nextStart(now: Int64) -> Int64 {
        state.withLock { state in
            _ = state.mayStart(now: now, rate: rate)
            return state.startableAt(now: now, rate: rate)
        }
    }

    var isCircuitOpen: Bool { state.withLock { $0.breaker.isOpen } }

    func abandonProbe(now: Int64) {
        state.withLock { $0.breaker.probeAbandoned(now: now) }
    }

    var isDisabled: Bool { state.withLock { $0.disabled } }

    /// - Parameter replayed: a replayed delivery's success re-enables an endpoint disabled by a 410.
    func record(success: Bool, replayed: Bool = false, now: Int64) -> CircuitBreaker.Transition {
        let (transition, open) = state.withLock { state -> (CircuitBreaker.Transition, Bool) in
            if success && replayed { state.disabled = false }
            let transition = state.breaker.record(success: success, now: now)
            return (transition, state.breaker.isOpen)
        }
        if transition != .none { counters.circuitOpen.record(open ? 1 : 0) }
        return transition
    }

    /// Enables the endpoint a 410 disabled (`POST .../endpoints/{id}/enable`). Returns whether it was disabled.
    func enable() -> Bool {
        state.withLock { state in
            defer { state.disabled = false }
            return state.disabled
        }
    }

    /// What the endpoints route shows of this lane.
    func status(now: Int64) -> EndpointStatus {
        state.withLock { state in
            EndpointStatus(
                endpoint: id, app: app, circuitOpen: state.breaker.isOpen, disabled: state.disabled,
                pausedUntil: state.resumeAt > now ? state.resumeAt : nil, at: now)
        }
    }

    /// Disables the endpoint (410 Gone). Returns whether it was enabled.
    func disable() -> Bool {
        state.withLock { state in
            defer { state.disabled = true }
            return !state.disabled
        }
    }

    /// Intake stopped: queued deliveries no longer start.
    func stop() {
        state.withLock { $0.stopped = true }
    }

    /// Drops the queued deliveries, also those waiting behind their key (not done: redelivered later).
    /// Returns how many.
    func dropWaiting() -> Int {
        state.withLock { state in
            let count = state.waiting.count + state.keys.values.reduce(0) { $0 + $1.followers.count }
            state.waiting.removeAll()
            state.keys.removeAll()
            return count
        }
    }
}
