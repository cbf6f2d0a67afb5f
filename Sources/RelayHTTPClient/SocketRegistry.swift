/// The engine's epoll bookkeeping as a value: which sockets are registered and for what, which idle
/// ones stay registered (parked), and which left the set during the current batch of events. It makes
/// no system call: each method says which `epoll_ctl` change to make, and the engine makes it. So the
/// rules are tested alone, like the consumers' `ConsumerBookkeeping`.
///
/// A kept-alive connection is watched for a response, then REMOVEd when it goes idle, then watched for
/// the next response when reused: two `epoll_ctl` calls per request. Instead an own socket waiting for
/// input stays registered while idle (parked): reuse costs nothing, and the one that stirs while idle
/// leaves the set then. `closing` takes any registration away before the socket is closed, so none
/// outlives it, even when a child process inherited a copy. Other sockets (libcurl's own, such as a
/// resolver's) leave the set on REMOVE, while still open.
struct SocketRegistry {
    /// libcurl's `CURL_POLL_*` values.
    static let pollIn: Int32 = 1
    static let pollRemove: Int32 = 4

    /// The `epoll_ctl` change a call asks for.
    enum Change: Equatable {
        case none
        /// Register the socket for `interest` (`add`: it is new to the set), then report with `applied`.
        case watch(interest: Int32, add: Bool)
        /// Take it out of the set.
        case remove
    }

    /// What to do with an event epoll reported for a socket.
    enum Event: Equatable {
        /// Hand it to libcurl.
        case act
        /// Nothing: it left the set earlier in this batch (its number may already be a new socket's).
        case stale
        /// An idle connection's socket stirred (the peer closed it, or sent what nobody asked for): take
        /// it out of the set; libcurl finds out when it next looks at the connection.
        case unpark
    }

    private struct Registration {
        var interest: Int32
        var parked = false
    }

    private var registrations: [Int32: Registration] = [:]
    private(set) var parkedCount = 0
    private var deregisteredInBatch: Set<Int32> = []
    /// Sockets opened through the engine and not yet closed through it: only their close is seen, so
    /// only they stay registered while idle.
    private var ownSockets: Set<Int32> = []

    /// Sockets in the epoll set.
    var registeredCount: Int { registrations.count }

    /// libcurl's socket callback: watch `socket` for `what` (`CURL_POLL_IN` / `OUT` / `INOUT` / `REMOVE`).
    mutating func watch(_ socket: Int32, _ what: Int32) -> Change {
        let current = registrations[socket]
        if what == Self.pollRemove {
            guard let current else { return .none }
            if current.interest == Self.pollIn, ownSockets.contains(socket) {
                if !current.parked {
                    registrations[socket]?.parked = true
                    parkedCount += 1
                }
                return .none
            }
            deregister(socket)
            return .remove
        }
        if let current, current.interest == what {
            if current.parked {
                registrations[socket]?.parked = false
                parkedCount -= 1
            }
            return .none
        }
        return .watch(interest: what, add: current == nil)
    }

    /// The outcome of a `.watch` change; returns `.remove` when a failed change leaves a stale registration.
    mutating func applied(_ socket: Int32, _ what: Int32, succeeded: Bool) -> Change {
        let current = registrations[socket]
        if succeeded {
            if current?.parked == true { parkedCount -= 1 }
            registrations[socket] = Registration(interest: what)
            return .none
        }
        guard current != nil else { return .none }
        deregister(socket)
        return .remove
    }

    /// A socket the engine opened.
    mutating func opened(_ socket: Int32) {
        ownSockets.insert(socket)
    }

    /// An own socket is about to be closed: `.remove` when it is in the set.
    mutating func closing(_ socket: Int32) -> Change {
        ownSockets.remove(socket)
        guard registrations[socket] != nil else { return .none }
        deregister(socket)
        return .remove
    }

    /// A new batch of epoll events begins.
    mutating func beginBatch() {
        if !deregisteredInBatch.isEmpty { deregisteredInBatch.removeAll(keepingCapacity: true) }
    }

    /// What to do with an event for `socket` in this batch; nil when the socket is not registered.
    mutating func event(_ socket: Int32) -> Event? {
        if !deregisteredInBatch.isEmpty, deregisteredInBatch.contains(socket) { return .stale }
        guard let registration = registrations[socket] else { return nil }
        guard registration.parked else { return .act }
        deregister(socket)
        return .unpark
    }

    private mutating func deregister(_ socket: Int32) {
        if registrations.removeValue(forKey: socket)?.parked == true { parkedCount -= 1 }
        deregisteredInBatch.insert(socket)
    }
}
