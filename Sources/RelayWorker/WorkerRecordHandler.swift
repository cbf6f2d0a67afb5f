public import RelayCore

/// What the worker does with one raw notification record. Returning means everything the record
/// caused is durable (produced with acks=all, or written to the backend), so the worker may mark it
/// done. Throwing means it is not: the worker retries the same record, and never skips it.
///
/// A notification that is *wrong* (bad signature, unknown app) is not an error here: the handler
/// records the verdict durably (the rejected topic) and returns.
public protocol WorkerRecordHandler: Sendable {
    func process(_ record: ConsumedRecord) async throws
}
