import CoreMetrics
import DequeModule
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
import ServiceLifecycle
import Synchronization

/// One endpoint's signer, limits, queue and breaker.
final class EndpointLane: Sendable {
    struct Pending: Sendable {
        var record: ConsumedRecord
        var delivery: DeliveryRecord
        /// This delivery is the open breaker's probe.
        var probe = false
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
    }

    let id: String
    let url: String
    let signer: WebhookSigner
    let counters: EndpointCounters
    private let state: Mutex<State>

    init(id: String, url: String, signer: WebhookSigner, breaker: CircuitBreaker, metrics: any MetricsFactory) {
        self.id = id
        self.url = url
        self.signer = signer
        self.counters = EndpointCounters(endpoint: id, metrics: metrics)
        self.state = Mutex(State(breaker: breaker))
    }

    /// Whether `delivery` may start now, waits for a slot, or goes elsewhere.
    /// - Parameter isNew: the record comes from `relay.deliveries` (not a retry topic, where due retries
    ///   and deferred deliveries wait) and is not a replay: only those are held back by an open breaker.
    func admit(_ record: ConsumedRecord, _ delivery: DeliveryRecord, isNew: Bool, now: Int64, limit: Int, canDefer: Bool) -> Admission {
        let (admission, circuitOpen) = state.withLock { state -> (Admission, Bool) in
            if state.disabled && delivery.replayedFrom == nil { return (.disabled, true) }
            var probing = false
            if isNew {
                switch state.breaker.admitNew(now: now) {
                case .pass: break
                case .probe: probing = true
                case .divert: return (.divert("circuit open", evicted: []), true)
                }
            }
            if state.inFlight < limit {
                if state.inFlight == 0 { state.lastProgressAt = now }
                state.inFlight += 1
                return (.start(probe: probing), state.breaker.isOpen)
            }
            // A busy endpoint that keeps finishing transfers queues without bound (the consumer's
            // back-pressure bounds it); a stalled one keeps a queue of `limit` and defers the rest.
            let stalled = now - state.lastProgressAt > Self.stallMilliseconds
            if !stalled || state.waiting.count < limit || !canDefer {
                state.waiting.append(Pending(record: record, delivery: delivery, probe: probing))
                return (.queued, state.breaker.isOpen)
            }
            if probing { state.breaker.probeAbandoned(now: now) }
            var evicted: [Pending] = []
            while state.waiting.count > limit, let last = state.waiting.popLast() {
                if last.probe { state.breaker.probeAbandoned(now: now) }
                evicted.append(last)
            }
            return (.divert("endpoint stalled", evicted: evicted.reversed()), state.breaker.isOpen)
        }
        counters.circuitOpen.record(circuitOpen ? 1 : 0)
        return admission
    }

    /// A transfer finished: the next queued delivery takes its slot (returned), or the slot is freed.
    func release(now: Int64) -> Pending? {
        state.withLock { state in
            state.lastProgressAt = now
            if !state.stopped, let next = state.waiting.popFirst() { return next }
            state.inFlight -= 1
            return nil
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

    /// Drops the queued deliveries (not done: redelivered later). Returns how many.
    func dropWaiting() -> Int {
        state.withLock { state in
            defer { state.waiting.removeAll() }
            return state.waiting.count
        }
    }
}
