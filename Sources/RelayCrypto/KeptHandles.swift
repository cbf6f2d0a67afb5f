import Synchronization

/// OpenSSL handles made ready once and lent to one use at a time (verification contexts, big-number
/// contexts), owned: at most `limit` are kept, the rest, and the kept ones at the end, are freed with `release`.
final class KeptHandles: Sendable {
    private let handles = Mutex<[Handle]>([])
    private let limit: Int
    private let release: @Sendable (OpaquePointer) -> Void

    init(limit: Int, release: @escaping @Sendable (OpaquePointer) -> Void) {
        self.limit = limit
        self.release = release
    }

    deinit { handles.withLock { $0.forEach { release($0.pointer) } } }

    /// A kept handle, or nil when none is free (the caller makes one).
    func take() -> OpaquePointer? { handles.withLock { $0.popLast()?.pointer } }

    /// Keeps `handle` for the next use, or frees it when `limit` are kept already.
    func giveBack(_ handle: OpaquePointer) {
        let ready = Handle(pointer: handle)
        let kept = handles.withLock { handles in
            guard handles.count < limit else { return false }
            handles.append(ready)
            return true
        }
        if !kept { release(handle) }
    }

    /// Frees `handle` instead of keeping it (one a failed use touched).
    func discard(_ handle: OpaquePointer) { release(handle) }

    var count: Int { handles.withLock { $0.count } }

    /// A handle not in use: only the thread that takes it from the list, or made it, touches it.
    private struct Handle: @unchecked Sendable {
        let pointer: OpaquePointer
    }
}
