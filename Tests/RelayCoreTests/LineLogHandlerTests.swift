#if canImport(Glibc)
import Glibc
#endif
import Dispatch
import Logging
@testable import RelayCore
import Synchronization
import Testing

/// What a handler wrote, line by line.
private final class Lines: Sendable {
    let all = Mutex<[String]>([])
}

/// swift-log's handler writing into `Lines`, the format the relay's lines must keep.
private struct CapturingStream: TextOutputStream, Sendable {
    let lines: Lines
    mutating func write(_ string: String) {
        lines.all.withLock { $0.append(string) }
    }
}

private struct SomeFailure: Error, CustomStringConvertible {
    var description: String { "the broker went away" }
}

@Suite struct LineLogHandlerTests {
    /// Each line as StreamLogHandler writes it, after the timestamp (the first word), and the timestamp of both
    /// from the same second.
    @Test func writesTheLinesStreamLogHandlerWrites() throws {
        let provider = Logger.MetadataProvider { ["trace-id": "abc"] }
        for label in ["relay.worker", ""] {
            for withProvider in [false, true] {
                let ours = Lines(), theirs = Lines()
                let mine = LineLogHandler(label: label, metadataProvider: withProvider ? provider : nil) { line in
                    ours.all.withLock { $0.append(line) }
                }
                let reference = StreamLogHandler(label: label, stream: CapturingStream(lines: theirs), metadataProvider: withProvider ? provider : nil)
                var loggers = [Logger(label: label, factory: { _ in mine }), Logger(label: label, factory: { _ in reference })]
                for index in loggers.indices {
                    loggers[index].logLevel = .trace
                    loggers[index][metadataKey: "store"] = "apple"
                    loggers[index][metadataKey: "app"] = "com.example.app"
                }
                for logger in loggers {
                    logger.info("notification normalized", metadata: ["events": "renewal,subscription_status_did_change", "log.partition": "3"])
                    logger.warning("plain line")
                    logger.error("nested", metadata: ["list": ["a", "b"], "map": ["k": "v"], "store": "google"])
                    logger.notice("with an error", error: SomeFailure())
                    logger.critical("with an error and metadata", error: SomeFailure(), metadata: ["z": "last", "a": "first"])
                    logger.trace("trace")
                    logger.debug("debug")
                }
                let mineLines = ours.all.withLock { $0 }, referenceLines = theirs.all.withLock { $0 }
                #expect(mineLines.count == 7)
                #expect(mineLines.count == referenceLines.count)
                for (a, b) in zip(mineLines, referenceLines) {
                    let (stampA, restA) = try #require(Self.split(a)), (stampB, restB) = try #require(Self.split(b))
                    #expect(restA == restB)
                    #expect(stampA.count == stampB.count)
                }
            }
        }
        // A logger without any metadata or provider uses the prepared (empty) part.
        let bare = Lines()
        Logger(label: "x", factory: { LineLogHandler(label: $0, metadataProvider: nil) { line in bare.all.withLock { $0.append(line) } } })
            .info("hello")
        let line = try #require(bare.all.withLock { $0.first })
        #expect(try #require(Self.split(line)).rest == "info x: [RelayCoreTests] hello\n")
    }

    /// The metadata's text is made at the first line and shared by copies: a change after a line, or in a
    /// copy, shows in the next line of that logger only, as with StreamLogHandler.
    @Test func metadataChangedAfterALineOrInACopyIsWrittenAsItIsNow() throws {
        let ours = Lines(), theirs = Lines()
        let mine = LineLogHandler(label: "l", metadataProvider: nil) { line in ours.all.withLock { $0.append(line) } }
        let reference = StreamLogHandler(label: "l", stream: CapturingStream(lines: theirs), metadataProvider: nil)
        for factory in [{ (_: String) -> any LogHandler in mine }, { (_: String) -> any LogHandler in reference }] {
            var logger = Logger(label: "l", factory: factory)
            logger[metadataKey: "store"] = "apple"
            logger.info("one")
            logger.info("one again")
            logger[metadataKey: "app"] = "first"
            logger.info("two")
            var copy = logger
            copy[metadataKey: "app"] = "second"
            copy[metadataKey: "store"] = nil
            copy.info("copy")
            logger.info("original")
            copy[metadataKey: "app"] = nil
            copy.info("emptied")
            logger.info("original again")
        }
        let mineLines = ours.all.withLock { $0 }, referenceLines = theirs.all.withLock { $0 }
        #expect(mineLines.count == 7)
        #expect(mineLines.map { Self.split($0)?.rest } == referenceLines.map { Self.split($0)?.rest })
        #expect(mineLines.map { Self.split($0)?.rest }[4] == "info l: app=first store=apple [RelayCoreTests] original\n")
    }

    /// The cached text is strftime's for its second, and moves on with the second.
    @Test func theTimestampIsTheLocalTimeOfItsSecond() {
        let clock = LocalTimestamp()
        let now = time(nil)
        for second in [now, now, now + 1, now - 3600, 0, now] {
            #expect(clock.text(at: second) == LocalTimestamp.format(second))
        }
        #expect(clock.text(at: now) != clock.text(at: now + 1))
        // The format: 2026-11-28T05:25:17+0000.
        let text = LocalTimestamp.format(now)
        #expect(text.count == 24)
        #expect(text.dropFirst(4).first == "-" && text.dropFirst(10).first == "T")
    }

    /// Lines written at once from many threads arrive whole, each once. The threads are the system's own
    /// (blocking writes to a full pipe must not hold Swift's pool, which the reader needs).
    @Test func linesFromManyThreadsArriveWhole() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        let (reading, writing) = (ends[0], ends[1])
        let received = Mutex<[UInt8]>([])
        let done = DispatchSemaphore(value: 0)
        startDedicatedThread(named: "test-reader") {
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = read(reading, &buffer, buffer.count)
                if count <= 0 { break }
                received.withLock { $0 += buffer[..<count] }
            }
            done.signal()
        }
        // Longer than a pipe holds, so that each line takes several writes.
        let body = String(repeating: "x", count: 80_000)
        let written = DispatchSemaphore(value: 0)
        for thread in 0..<8 {
            startDedicatedThread(named: "test-writer") {
                for line in 0..<5 { StandardError.write("\(thread) \(line) \(body)\n", to: writing) }
                written.signal()
            }
        }
        for _ in 0..<8 { written.wait() }
        close(writing)
        done.wait()
        close(reading)
        let lines = String(decoding: received.withLock { $0 }, as: UTF8.self).split(separator: "\n")
        #expect(lines.count == 40)
        #expect(Set(lines).count == 40)
        #expect(lines.allSatisfy { $0.hasSuffix(" " + body) && $0.split(separator: " ").count == 3 })
    }

    private static func split(_ line: String) -> (stamp: Substring, rest: Substring)? {
        guard let space = line.firstIndex(of: " ") else { return nil }
        return (line[..<space], line[line.index(after: space)...])
    }
}
