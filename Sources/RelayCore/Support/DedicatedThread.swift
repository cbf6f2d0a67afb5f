import Foundation

/// Starts an OS thread (not one of Swift's cooperative pool) for blocking C calls, named so it shows
/// in `top -H`, `perf` and debuggers. The name is set from inside the thread: Foundation on Linux
/// does not apply one set before `start()`, and the thread would carry the name of the thread that
/// started it. Linux keeps the first 15 bytes.
public func startDedicatedThread(named name: String, _ body: @escaping @Sendable () -> Void) {
    let thread = Thread {
        Thread.current.name = String(decoding: name.utf8.prefix(15), as: UTF8.self)
        body()
    }
    thread.start()
}
