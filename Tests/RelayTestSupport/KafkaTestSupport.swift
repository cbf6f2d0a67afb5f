import Foundation
public import Logging
public import RelayCore
public import RelayKafka
import Synchronization

/// The logger the code under test gets: quiet (critical only), so a passing run prints only the test
/// results; `RELAY_TEST_LOG=info` (or debug, warning, ...) shows the logs, e.g. when rerunning a failing test.
public func testLogger(_ label: String = "test") -> Logger {
    var logger = Logger(label: label)
    logger.logLevel = ProcessInfo.processInfo.environment["RELAY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
    return logger
}

/// A unique name per test, so tests never share topics or groups.
public func uniqueName(_ prefix: String) -> String {
    "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())"
}

/// Waits until `condition` holds, checking every 20 ms, failing after `timeout`. The timeout is a
/// generous upper bound for a slow CI machine, not something the test relies on.
public func waitUntil(
    _ what: String, timeout: Duration = .seconds(60), _ condition: @Sendable () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while try await !condition() {
        guard ContinuousClock.now < deadline else { throw TestTimeout(what: what) }
        try await Task.sleep(for: .milliseconds(20))
    }
}

public struct TestTimeout: Error, CustomStringConvertible {
    public var what: String
    public var description: String { "timed out waiting for \(what)" }
}

/// Drains a consumer's record stream in the background so a test can wait for what arrived.
public final class RecordCollector: Sendable {
    private let received = LockedBox<[ConsumedRecord]>([])
    private let task: Task<Void, Never>

    public init(_ stream: AsyncStream<ConsumedRecord>) {
        let received = self.received
        task = Task {
            for await record in stream { received.withLock { $0.append(record) } }
        }
    }

    public var records: [ConsumedRecord] { received.withLock { $0 } }
    public var count: Int { received.withLock { $0.count } }

    /// Waits until at least `count` records arrived; returns all that did.
    @discardableResult
    public func waitFor(count: Int, timeout: Duration = .seconds(60)) async throws -> [ConsumedRecord] {
        try await waitUntil("\(count) records", timeout: timeout) { self.count >= count }
        return records
    }

    public func cancel() { task.cancel() }
}

/// Settings that make consumer-group tests fast against the mock cluster: it admits a new member
/// only after `session.timeout.ms - 1 s`, so a short session keeps joins quick.
public func testConsumerConfiguration(group: String, topics: [String], maxInFlight: Int = 1000) -> KafkaConsumerConfiguration {
    var configuration = KafkaConsumerConfiguration(groupID: group, topics: topics)
    configuration.sessionTimeout = .seconds(6)
    configuration.commitInterval = .milliseconds(200)
    configuration.maxInFlight = maxInFlight
    return configuration
}

/// The payload of a record as text.
public func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

/// A value behind a lock, shareable between tasks.
public final class LockedBox<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    public init(_ value: Value) { mutex = Mutex(value) }
    public func withLock<Result: Sendable>(_ body: (inout sending Value) -> sending Result) -> Result { mutex.withLock(body) }
    public var value: Value { mutex.withLock { $0 } }
}

/// A consumer that never stores an offset: a stage on it behaves like one that crashes after each
/// record's work and before the offset store.
public final class ForgetfulConsumer: RecordConsumer {
    let inner: any RecordConsumer
    public init(_ inner: any RecordConsumer) { self.inner = inner }
    public var records: AsyncStream<ConsumedRecord> { inner.records }
    public func markDone(_ record: ConsumedRecord) {}
    public func close() async { await inner.close() }
    public func isAssigned(_ record: ConsumedRecord) -> Bool { inner.isAssigned(record) }
}
