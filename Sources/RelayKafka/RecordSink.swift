import CoreMetrics
import Logging
import RelayCore
internal import CRdKafka
import Dispatch
import Synchronization

/// Where the poll thread puts the records it hands out: the `records` stream, or a `consume(_:)`
/// handler called on the poll thread. Stopping a handler waits for a call in progress, so none runs
/// once `stop()` returned.
final class RecordSink: Sendable {
    private enum Target {
        case stream(AsyncStream<ConsumedRecord>.Continuation)
        case handler(@Sendable (ConsumedRecord) -> Void)
    }

    private struct State {
        var stopped = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let target: Target
    private let state = Mutex(State())
    private let stoppedFlag = Atomic<Bool>(false)

    init(_ continuation: AsyncStream<ConsumedRecord>.Continuation) { target = .stream(continuation) }
    init(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) { target = .handler(handler) }

    var isStopped: Bool { stoppedFlag.load(ordering: .acquiring) }

    func emit(_ record: ConsumedRecord) {
        switch target {
        case .stream(let continuation):
            continuation.yield(record)
        case .handler(let handler):
            // Under the lock: `stop()` cannot return while a record is being handled.
            state.withLock { state in
                if !state.stopped { handler(record) }
            }
        }
    }

    func emit(_ records: [ConsumedRecord]) {
        for record in records { emit(record) }
    }

    /// No record is handed to the handler any more; `untilStopped()` returns.
    func stop() {
        let waiters = state.withLock { state in
            state.stopped = true
            defer { state.waiters = [] }
            return state.waiters
        }
        stoppedFlag.store(true, ordering: .releasing)
        for waiter in waiters { waiter.resume() }
    }

    func untilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let stopped = state.withLock { state in
                if !state.stopped { state.waiters.append(continuation) }
                return state.stopped
            }
            if stopped { continuation.resume() }
        }
    }
}
