import Synchronization

/// The consumers of this process, woken when it appends to one of their topics.
final class ConsumerRegistry: Sendable {
    private let list = Mutex<[EmbeddedConsumer]>([])
    func add(_ consumer: EmbeddedConsumer) { list.withLock { $0.append(consumer) } }
    var all: [EmbeddedConsumer] { list.withLock { $0 } }
    func removeAll() -> [EmbeddedConsumer] {
        list.withLock { list in
            defer { list = [] }
            return list
        }
    }
}
