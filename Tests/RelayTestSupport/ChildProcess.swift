public import Foundation
import RelayCore

/// What a child process printed and how it exited.
public struct ChildProcessResult: Sendable {
    public var status: Int32
    public var stdout: [UInt8]
    public var stderr: String

    public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
}

/// Runs `executable` to its end with the pipes read and the exit awaited on dedicated threads, not on
/// Swift's cooperative pool: a test blocked there would starve the servers and continuations of the
/// tests running beside it (the pool has one thread per core).
public func runChildProcess(_ executable: URL, _ arguments: [String]) async throws -> ChildProcessResult {
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    let output = Pipe()
    let errors = Pipe()
    process.standardOutput = output
    process.standardError = errors
    try process.run()
    let running = UncheckedBox(process)
    let stdout = output.fileHandleForReading
    let stderr = errors.fileHandleForReading
    return await withCheckedContinuation { continuation in
        // Both pipes at once: a child filling one while the other is read would never finish.
        let errorText = LockedBox<[UInt8]>([])
        let errorsRead = DispatchSemaphore(value: 0)
        startDedicatedThread(named: "test-stderr") {
            let bytes = [UInt8](stderr.readDataToEndOfFile())
            errorText.withLock { $0 = bytes }
            errorsRead.signal()
        }
        startDedicatedThread(named: "test-child") {
            let printed = [UInt8](stdout.readDataToEndOfFile())
            errorsRead.wait()
            running.value.waitUntilExit()
            continuation.resume(
                returning: ChildProcessResult(
                    status: running.value.terminationStatus, stdout: printed, stderr: String(decoding: errorText.value, as: UTF8.self)))
        }
    }
}

/// Hands a non-Sendable value to one other thread that alone uses it from then on.
final class UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
