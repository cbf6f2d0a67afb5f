import DequeModule
import Dispatch
import Logging
import RelayCore
import Synchronization

/// How many bytes each client address has had written to the notifications topic that the worker has
/// not processed (verified) yet, so one client cannot fill the log faster than the worker rejects what
/// it sent (`ingest.clientLimit.unverifiedBytes`).
///
/// Each accepted request is charged at its log position; a charge is released once the worker group's
/// stored offset in that partition is past it. The stored offsets are read (`processedOffsets`, a
/// blocking call: off the cooperative pool, on a dispatch queue) when a client nears its bound, at most
/// once a second, so an idle or well-behaved ingest never reads them.
///
/// If the progress cannot be read (the brokers are away, or the ingest's Kafka principal may not read the
/// group's offsets), the bound is dropped until it can: refusing every busy client until the stores gave up
/// would lose what the bound is there to protect.
///
/// Memory is bounded: a client's charges in one partition are merged into chunks of at least 1/32 of the
/// bound (a chunk is released when its last record is processed, so a merge only ever delays a release),
/// and at most `maxClients` clients are tracked (past that, the half with the least outstanding is
/// forgotten: the log's own budget still bounds the whole).
final class UnverifiedBytes: Sendable {
    private struct Chunk {
        var lastOffset: Int64
        var bytes: Int64
    }

    private struct Client {
        var partitions: [Int32: Deque<Chunk>] = [:]
        var bytes: Int64 = 0
    }

    private struct State {
        var clients: [String: Client] = [:]
        var refreshing = false
        var lastRefresh: ContinuousClock.Instant?
        /// The last read of the worker's progress failed (logged once until one succeeds).
        var failing = false
    }

    let limit: Int64
    private let chunkBytes: Int64
    private let maxClients: Int
    private let processedOffsets: @Sendable () throws -> [Int32: Int64]
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "ingest-unverified-bytes")
    private let logger: Logger

    /// - Parameters:
    ///   - limit: bytes per client; 0 turns the bound off.
    ///   - processedOffsets: the worker group's next offset per partition of the notifications topic.
    init(limit: Int64, maxClients: Int = 100_000, logger: Logger, processedOffsets: @escaping @Sendable () throws -> [Int32: Int64]) {
        self.limit = limit
        self.chunkBytes = max(1, limit / 32)
        self.maxClients = maxClients
        self.processedOffsets = processedOffsets
        self.logger = logger
    }

    /// Whether `client` may have more written; past half the bound, the worker's progress is read soon.
    func admits(_ client: String) -> Bool {
        guard limit > 0 else { return true }
        let (outstanding, failing) = state.withLock { ($0.clients[client]?.bytes ?? 0, $0.failing) }
        // Failing open: until a read of the worker's progress succeeds again, no client is bounded.
        guard !failing else {
            refreshSoon()
            return true
        }
        if outstanding >= limit / 2 { refreshSoon() }
        return outstanding < limit
    }

    /// Charges `bytes` written at `position` to `client`.
    func charge(_ client: String, at position: RecordPosition, bytes: Int64) {
        guard limit > 0 else { return }
        let chunkBytes = self.chunkBytes
        let maxClients = self.maxClients
        let outstanding = state.withLock { state -> Int64 in
            if state.clients[client] == nil, state.clients.count >= maxClients {
                // Forget the half with the least outstanding: a flood from many addresses cannot wipe out the
                // count of the one client that sent the most.
                let kept = state.clients.sorted { $0.value.bytes > $1.value.bytes }.prefix(maxClients / 2)
                state.clients = Dictionary(uniqueKeysWithValues: kept.map { ($0.key, $0.value) })
            }
            var entry = state.clients[client] ?? Client()
            var chunks = entry.partitions[position.partition] ?? []
            if var last = chunks.last, last.bytes < chunkBytes, position.offset > last.lastOffset {
                last.lastOffset = position.offset
                last.bytes += bytes
                chunks[chunks.count - 1] = last
            } else {
                chunks.append(Chunk(lastOffset: position.offset, bytes: bytes))
            }
            entry.partitions[position.partition] = chunks
            entry.bytes += bytes
            state.clients[client] = entry
            return entry.bytes
        }
        if outstanding >= limit / 2 { refreshSoon() }
    }

    /// Releases every chunk whose last record is below the worker's next offset in its partition.
    func release(processed: [Int32: Int64]) {
        state.withLock { state in
            for (address, var client) in state.clients {
                for (partition, var chunks) in client.partitions {
                    guard let next = processed[partition] else { continue }
                    while let first = chunks.first, first.lastOffset < next {
                        client.bytes -= first.bytes
                        chunks.removeFirst()
                    }
                    client.partitions[partition] = chunks.isEmpty ? nil : chunks
                }
                state.clients[address] = client.bytes > 0 ? client : nil
            }
        }
    }

    /// Reads the worker's progress on the queue, unless a read is running or one finished within a second.
    private func refreshSoon() {
        let start = state.withLock { state -> Bool in
            if state.refreshing { return false }
            if let last = state.lastRefresh, ContinuousClock.now - last < .seconds(1) { return false }
            state.refreshing = true
            return true
        }
        guard start else { return }
        queue.async { [self] in
            do {
                let processed = try processedOffsets()
                release(processed: processed)
                let recovered = state.withLock { state in
                    defer { state.failing = false }
                    return state.failing
                }
                if recovered { logger.notice("the ingest reads the worker's progress again; ingest.clientLimit.unverifiedBytes applies again") }
            } catch {
                // Fail open: a bound the ingest cannot release (no permission to read the group's offsets, brokers
                // away) would refuse every busy client until the stores gave up. The log's own limits still hold.
                let first = state.withLock { state in
                    defer {
                        state.failing = true
                        state.clients.removeAll()
                    }
                    return !state.failing
                }
                if first {
                    logger.warning(
                        "cannot read the worker's progress; ingest.clientLimit.unverifiedBytes is not enforced until it can",
                        metadata: [LogKey.error: "\(error)"])
                }
            }
            state.withLock { state in
                state.refreshing = false
                state.lastRefresh = .now
            }
        }
    }
}
