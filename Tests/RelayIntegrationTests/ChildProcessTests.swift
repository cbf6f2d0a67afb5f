import Foundation
import RelayTestSupport
import Testing

/// The tests' child processes (`runChildProcess`): many started at once must each get exactly their own
/// output and exit code. Foundation's `Process.run()` crashed the test process here (SIGSEGV).
@Suite struct ChildProcessTests {
    static let shell = URL(fileURLWithPath: "/bin/sh")

    @Test func manyChildrenStartedAtOnceEachGetTheirOwnOutputAndStatus() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<300 {
                group.addTask {
                    let result = try await runChildProcess(
                        Self.shell, ["-c", "echo out-$0; echo err-$0 >&2; exit $(($0 % 7))", "\(index)"])
                    #expect(result.stdoutText == "out-\(index)\n")
                    #expect(result.stderr == "err-\(index)\n")
                    #expect(result.status == Int32(index % 7))
                }
            }
            try await group.waitForAll()
        }
    }

    @Test func aChildHasAnEmptyStdinAndDefaultSignalsAndLargeOutputDoesNotBlock() async throws {
        let empty = try await runChildProcess(Self.shell, ["-c", "cat; echo done"])
        #expect(empty.stdoutText == "done\n")
        // SIGTERM at its default ends the child (a blocked or ignored one would leave it running).
        let terminated = try await runChildProcess(Self.shell, ["-c", "kill -TERM $$; sleep 5"])
        #expect(terminated.status == 128 + SIGTERM)
        // Both streams well past a pipe's buffer at once.
        let large = try await runChildProcess(Self.shell, ["-c", "head -c 1000000 /dev/zero; head -c 1000000 /dev/zero >&2"])
        #expect(large.stdout.count == 1_000_000)
        #expect(large.stderr.utf8.count == 1_000_000)
        await #expect(throws: ChildProcessError.self) { _ = try await runChildProcess(URL(fileURLWithPath: "/nonexistent/binary"), []) }
    }
}
