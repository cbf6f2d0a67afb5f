import Synchronization

/// A value known later (a port chosen when a server binds): `value()` waits until `set` published it.
public final class Eventual<Value: Sendable>: Sendable {
    private struct State {
        var value: Value?
        var waiters: [CheckedContinuation<Value, Never>] = []
        /// Waiters that give up when their task is cancelled, by id.
        var cancellable: [Int: CheckedContinuation<Value?, Never>] = [:]
        var nextID = 0
    }

    private let state: Mutex<State>

    public init(_ value: Value? = nil) {
        state = Mutex(State(value: value))
    }

    public func set(_ value: Value) {
        let (waiters, cancellable) = state.withLock { state in
            state.value = value
            defer {
                state.waiters = []
                state.cancellable = [:]
            }
            return (state.waiters, state.cancellable)
        }
        for waiter in waiters { waiter.resume(returning: value) }
        for waiter in cancellable.values { waiter.resume(returning: value) }
    }

    /// The value once set, or nil if the task is cancelled first.
    public func valueUnlessCancelled() async -> Value? {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Value?, Never>) in
                let resolved = state.withLock { state -> Value?? in
                    if let value = state.value { return .some(value) }
                    if Task.isCancelled { return .some(nil) }
                    state.cancellable[id] = continuation
                    return .none
                }
                if let resolved { continuation.resume(returning: resolved) }
            }
        } onCancel: {
            state.withLock { $0.cancellable.removeValue(forKey: id) }?.resume(returning: nil)
        }
    }

    /// Whether `set` has published the value.
    public var isSet: Bool { state.withLock { $0.value != nil } }

    public func value() async -> Value {
        await withCheckedContinuation { continuation in
            let value = state.withLock { state -> Value? in
                if state.value == nil { state.waiters.append(continuation) }
                return state.value
            }
            if let value { continuation.resume(returning: value) }
        }
    }
}
