import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayEmbeddedLog
import RelayTestSupport
import Testing

/// The command-line tools append one record after another: they open the embedded log unpaced, whatever
/// `log.commitInterval` says, or each of their appends would wait for the interval.
@Suite struct ToolLogPacingTests {
    @Test(.timeLimit(.minutes(1))) func aToolAppendsOneRecordAfterAnotherWithoutWaitingForTheCommitInterval() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("tool-log")).path
        // The log a tool appends to exists (its owner made it).
        let owner = try EmbeddedRecordLog(directory: directory, topics: ["t"], partitions: 1, logger: testLogger())
        await owner.close()
        var configuration = try RelayConfiguration.parse(yaml: "log: { kind: embedded }", baseDirectory: directory, environment: [:])
        // Past the parser's bound on purpose: paced, the second append alone would run past the time limit.
        configuration.log.commitInterval = .seconds(90)
        let log = try ToolLog.open(configuration: configuration, bootstrapServers: nil, dataDirectory: directory, clientID: "test", logger: testLogger())
        let producer = try log.producer
        for index in 0..<3 {
            let position = try await producer.produce(OutgoingRecord(topic: "t", key: nil, value: Array("\(index)".utf8)))
            #expect(position.offset == Int64(index))
        }
        await log.close()
    }
}
