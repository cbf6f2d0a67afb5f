import Foundation

/// Runs an operation, trying it again after each of `delays` while its failure is retriable.
///
/// - Parameters:
///   - delays: the waits before the second, third, ... attempt; its count is the number of retries.
///   - isRetriable: whether a failure may succeed when tried again.
///   - onRetry: told of each failure about to be retried, with its retry's number (1 for the first).
///   - wait: the wait before a retry, from the failure and its scheduled delay (a server's
///     `Retry-After` may ask for longer); the scheduled delay by default.
/// - Returns: the first success. Throws the last failure, one that is not retriable, or (when the task is
///   cancelled during a wait) the failure that led to the wait.
public func withRetries<Value, Failure: Error>(
    delays: [Duration], isRetriable: (Failure) -> Bool, onRetry: (Failure, Int) -> Void = { _, _ in },
    wait: (Failure, Duration) -> Duration = { $1 }, _ operation: () async throws(Failure) -> Value
) async throws(Failure) -> Value {
    var attempt = 0
    while true {
        do throws(Failure) {
            return try await operation()
        } catch {
            guard isRetriable(error), attempt < delays.count else { throw error }
            onRetry(error, attempt + 1)
            let failure = error
            do { try await Task.sleep(for: wait(failure, delays[attempt])) } catch { throw failure }
            attempt += 1
        }
    }
}

/// Exponential backoff for a loop that retries until it succeeds or is cancelled: `initial`, doubling
/// up to `maximum`.
public struct Backoff: Sendable {
    public let initial: Duration
    public let maximum: Duration
    private var current: Duration

    public init(initial: Duration, maximum: Duration) {
        self.initial = initial
        self.maximum = maximum
        self.current = initial
    }

    /// The next wait; each call doubles the one after it, up to `maximum`.
    public mutating func next() -> Duration {
        defer { current = min(current * 2, maximum) }
        return current
    }

    /// `count` waits of this backoff from its start: the delays of `withRetries`.
    public func delays(_ count: Int) -> [Duration] {
        var copy = Backoff(initial: initial, maximum: maximum)
        return (0..<max(0, count)).map { _ in copy.next() }
    }
}

/// `Retry-After` (RFC 9110) in milliseconds from `now`: delta-seconds or an IMF-fixdate; nil when absent
/// or unreadable. The one parser for every client that honours it.
public enum RetryAfter {
    public static func milliseconds(_ value: String?, now: Int64) -> Int64? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = Int64(value) { return seconds >= 0 && seconds < 10_000_000 ? seconds * 1000 : nil }
        guard let date = HTTPDate.milliseconds(value) else { return nil }
        return max(0, date - now)
    }
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110 requires senders to use.
enum HTTPDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func milliseconds(_ text: String) -> Int64? {
        let parts = text.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]), let monthIndex = months.firstIndex(of: String(parts[2])),
            let year = Int(parts[3])
        else { return nil }
        let time = parts[4].split(separator: ":").compactMap { Int($0) }
        guard time.count == 3 else { return nil }
        func pad(_ value: Int, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return Timestamp.milliseconds(
            "\(pad(year, 4))-\(pad(monthIndex + 1, 2))-\(pad(day, 2))T\(pad(time[0], 2)):\(pad(time[1], 2)):\(pad(time[2], 2))Z")
    }
}
