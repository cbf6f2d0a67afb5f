/// Runs an operation, trying it again after each of `delays` while its failure is retriable.
///
/// - Parameters:
///   - delays: the waits before the second, third, ... attempt; its count is the number of retries.
///   - isRetriable: whether a failure may succeed when tried again.
///   - onRetry: told of each failure about to be retried, with its retry's number (1 for the first).
/// - Returns: the first success. Throws the last failure, one that is not retriable, or (when the task is
///   cancelled during a wait) the failure that led to the wait.
public func withRetries<Value, Failure: Error>(
    delays: [Duration], isRetriable: (Failure) -> Bool, onRetry: (Failure, Int) -> Void = { _, _ in },
    _ operation: () async throws(Failure) -> Value
) async throws(Failure) -> Value {
    var attempt = 0
    while true {
        do throws(Failure) {
            return try await operation()
        } catch {
            guard isRetriable(error), attempt < delays.count else { throw error }
            onRetry(error, attempt + 1)
            let failure = error
            do { try await Task.sleep(for: delays[attempt]) } catch { throw failure }
            attempt += 1
        }
    }
}
