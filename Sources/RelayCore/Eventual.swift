import Synchronization

/// A value known later (a port chosen when a server binds): `value()` waits until `set` published it.
public final class Eventual<Value: Sendable>: Sendable {
    private let state: Mutex<(value: Value?, waiters: [CheckedContinuation<Value, Never>])>

    public init(_ value: Value? = nil) {
        state = Mutex((value, []))
    }

    public func set(_ value: Value) {
        let waiters = state.withLock { state in
            state.value = value
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: value) }
    }

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
