import Foundation
import RelayCore
import Synchronization

/// A dedicated OS thread for librdkafka's blocking calls (poll, flush, close), so they never occupy
/// Swift's cooperative pool. Runs `body` repeatedly until stopped, then `finish` once.
final class PollThread: Sendable {
    private let stopRequested = Atomic<Bool>(false)
    private let finished: Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])> = Mutex((false, []))

    init(name: String, body: @escaping @Sendable () -> Void, finish: @escaping @Sendable () -> Void) {
        startDedicatedThread(named: name) { [self] in
            while !stopRequested.load(ordering: .acquiring) { body() }
            finish()
            let waiters = finished.withLock { state in
                state.done = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Asks the loop to stop after the current iteration and waits until `finish` has run.
    func stop() async {
        stopRequested.store(true, ordering: .releasing)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let alreadyDone = finished.withLock { state in
                if state.done { return true }
                state.waiters.append(continuation)
                return false
            }
            if alreadyDone { continuation.resume() }
        }
    }
}
