import Foundation
import RelayTestSupport
import Testing

/// The executable's exit codes (DESIGN section 2): 64 bad arguments, 78 bad configuration.
@Suite struct CommandLineTests {
    /// `swift test` builds the executable next to the test bundle.
    static var executable: URL? {
        let candidates = [
            Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("revenue-relay"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("revenue-relay"),
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("revenue-relay"),
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) }
    }

    func run(_ arguments: [String]) throws -> (status: Int32, stderr: String) {
        let process = Process()
        process.executableURL = try #require(Self.executable, "the revenue-relay executable was not built next to the tests")
        process.arguments = arguments
        let errorPipe = Pipe()
        process.standardError = errorPipe
        process.standardOutput = Pipe()
        try process.run()
        let stderr = String(decoding: errorPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, stderr)
    }

    @Test func badConfigurationExits78AndNamesTheKey() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("bad") + ".yaml")
        try Data("ingest: { listen: \"127.0.0.1:0\", maxBodyBytez: 5 }\n".utf8).write(to: file)
        let result = try run(["run", "--config", file.path, "--role", "ingest"])
        #expect(result.status == 78)
        #expect(result.stderr.contains("ingest.maxBodyBytez"))
        #expect(try run(["run", "--config", "/nonexistent/relay.yaml"]).status == 78)
    }

    @Test func badArgumentsExit64() throws {
        #expect(try run(["run", "--config", "config/dev.yaml", "--role", "accountant"]).status == 64)
        #expect(try run(["run"]).status == 64)
        #expect(try run(["frobnicate"]).status == 64)
    }
}
