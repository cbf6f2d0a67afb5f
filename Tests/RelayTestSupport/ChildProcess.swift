public import Foundation
import Glibc
import RelayCore

/// What a child process printed and how it exited.
public struct ChildProcessResult: Sendable {
    /// The exit code, or 128 + the signal's number when a signal ended it (as a shell reports it).
    public var status: Int32
    public var stdout: [UInt8]
    public var stderr: String

    public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
}

/// Why a child process could not be started.
public struct ChildProcessError: Error, CustomStringConvertible {
    public var description: String
}

/// Runs `executable` to its end, its stdin empty, with the pipes read and the exit awaited on dedicated
/// threads, not on Swift's cooperative pool: a test blocked there would starve the servers and
/// continuations of the tests running beside it (the pool has one thread per core).
///
/// The child is started with `posix_spawn` directly. Foundation's `Process.run()` crashed (SIGSEGV in
/// its spawn, then a robust-mutex assertion) when tests started children concurrently. The child's
/// output goes through socket pairs created close-on-exec in one call (`pipe2` is not available to
/// Swift here), so a child started at the same moment by another test never inherits them and holds them
/// open, which would keep this child's reader from seeing the end of its output.
public func runChildProcess(_ executable: URL, _ arguments: [String]) async throws -> ChildProcessResult {
    try await startChildProcess(executable, arguments).result()
}

/// A child started by `startChildProcess`: its output so far, signals, and its end.
public final class RunningChildProcess: Sendable {
    public let pid: pid_t
    private let printed = LockedBox<[UInt8]>([])
    private let complained = LockedBox<[UInt8]>([])
    private let ended = Eventual<ChildProcessResult>()

    fileprivate init(pid: pid_t, stdout: Int32, stderr: Int32) {
        self.pid = pid
        let printed = self.printed
        let ended = self.ended
        // Both pipes at once: a child filling one while the other is read would never finish.
        let errorText = LockedBox<[UInt8]>([])
        let errorsRead = DispatchSemaphore(value: 0)
        let complained = self.complained
        startDedicatedThread(named: "test-stderr") {
            let bytes = readToEnd(stderr, into: complained)
            errorText.withLock { $0 = bytes }
            errorsRead.signal()
        }
        startDedicatedThread(named: "test-child") {
            let bytes = readToEnd(stdout, into: printed)
            errorsRead.wait()
            ended.set(ChildProcessResult(status: waitForExit(pid), stdout: bytes, stderr: String(decoding: errorText.value, as: UTF8.self)))
        }
    }

    /// What the child printed on stdout so far.
    public var stdoutText: String { String(decoding: printed.value, as: UTF8.self) }

    /// Whether the child wrote `text` on stderr, waiting until it does, it ends, or `limit` passes.
    public func stderr(contains text: String, within limit: Duration) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if String(decoding: complained.value, as: UTF8.self).contains(text) { return true }
            if ended.isSet { return false }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    /// Sends `signal` while the child runs (never to a reaped pid another process may have now).
    public func signal(_ signal: Int32) {
        if !ended.isSet { kill(pid, signal) }
    }

    /// Kills a child a failed test left running; nothing once it has ended.
    public func killIfRunning() { signal(SIGKILL) }

    /// The child's end: exit status and everything it printed.
    public func result() async -> ChildProcessResult { await ended.value() }

    /// The first stdout line that starts with `prefix`, once printed, or nil when the child ended or
    /// `limit` passed first.
    public func line(startingWith prefix: String, within limit: Duration) async -> String? {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let line = stdoutText.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) { return String(line) }
            if ended.isSet { return nil }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }
}

/// Starts `executable` with its stdin empty; stdout and stderr are read on dedicated threads.
public func startChildProcess(_ executable: URL, _ arguments: [String]) throws -> RunningChildProcess {
    let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
    var output: [Int32] = [-1, -1]
    var errors: [Int32] = [-1, -1]
    guard socketpair(AF_UNIX, kind, 0, &output) == 0 else {
        throw ChildProcessError(description: "socketpair: \(String(cString: strerror(errno)))")
    }
    guard socketpair(AF_UNIX, kind, 0, &errors) == 0 else {
        let message = String(cString: strerror(errno))
        close(output[0])
        close(output[1])
        throw ChildProcessError(description: "socketpair: \(message)")
    }

    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    // dup2 leaves the copies on 1 and 2 open across exec; the close-on-exec originals close there.
    posix_spawn_file_actions_adddup2(&actions, output[1], 1)
    posix_spawn_file_actions_adddup2(&actions, errors[1], 2)

    // The child starts with no signal blocked and every signal at its default: the test runner's threads
    // block some, and a child inheriting that would ignore SIGTERM.
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var none = sigset_t()
    sigemptyset(&none)
    var all = sigset_t()
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attributes, &none)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

    let path = executable.path
    var argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) }
    argv.append(nil)
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, path, &actions, &attributes, argv, environ)
    close(output[1])
    close(errors[1])
    guard spawned == 0 else {
        close(output[0])
        close(errors[0])
        throw ChildProcessError(description: "posix_spawn \(path): \(String(cString: strerror(spawned)))")
    }

    return RunningChildProcess(pid: pid, stdout: output[0], stderr: errors[0])
}

/// Everything readable from `descriptor` until its end; closes it.
private func readToEnd(_ descriptor: Int32, into shared: LockedBox<[UInt8]>?) -> [UInt8] {
    defer { close(descriptor) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        if count > 0 {
            bytes.append(contentsOf: buffer[0..<count])
            shared?.withLock { $0.append(contentsOf: buffer[0..<count]) }
        } else if count == 0 || errno != EINTR {
            return bytes
        }
    }
}

/// Reaps the child: its exit code, or 128 + the signal that ended it.
private func waitForExit(_ pid: pid_t) -> Int32 {
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 {
        guard errno == EINTR else { return -1 }
    }
    let signal = status & 0x7f
    return signal == 0 ? (status >> 8) & 0xff : 128 + signal
}
