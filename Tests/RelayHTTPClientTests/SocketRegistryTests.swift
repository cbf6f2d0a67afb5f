@testable import RelayHTTPClient
import Testing

/// The engine's epoll bookkeeping alone: which `epoll_ctl` change each libcurl request asks for, idle
/// sockets parked instead of removed, and events of a socket that left the set in the same batch ignored.
@Suite struct SocketRegistryTests {
    static let pollIn: Int32 = 1
    static let pollOut: Int32 = 2
    static let remove: Int32 = 4

    @Test func anOwnIdleSocketIsParkedAndReusedWithoutASystemCall() {
        var registry = SocketRegistry()
        registry.opened(7)
        #expect(registry.watch(7, Self.pollOut) == .watch(interest: Self.pollOut, add: true))
        #expect(registry.applied(7, Self.pollOut, succeeded: true) == .none)
        #expect(registry.watch(7, Self.pollIn) == .watch(interest: Self.pollIn, add: false))
        #expect(registry.applied(7, Self.pollIn, succeeded: true) == .none)
        // The response is in; libcurl stops watching: it stays registered, parked.
        #expect(registry.watch(7, Self.remove) == .none)
        #expect(registry.registeredCount == 1 && registry.parkedCount == 1)
        // Reused for the next request: no epoll_ctl at all.
        #expect(registry.watch(7, Self.pollIn) == .none)
        #expect(registry.parkedCount == 0)
        // Closed: it leaves the set before the close.
        #expect(registry.closing(7) == .remove)
        #expect(registry.registeredCount == 0)
        #expect(registry.closing(7) == .none)
    }

    @Test func libcurlsOwnSocketsLeaveOnRemoveAndAStirringParkedSocketLeavesToo() {
        var registry = SocketRegistry()
        // A resolver's socket (not opened by the engine) leaves the set on REMOVE.
        #expect(registry.watch(3, Self.pollIn) == .watch(interest: Self.pollIn, add: true))
        _ = registry.applied(3, Self.pollIn, succeeded: true)
        #expect(registry.watch(3, Self.remove) == .remove)
        #expect(registry.registeredCount == 0)
        // A parked socket that stirs leaves the set; an event for it later in the batch is stale.
        registry.opened(9)
        _ = registry.watch(9, Self.pollIn)
        _ = registry.applied(9, Self.pollIn, succeeded: true)
        _ = registry.watch(9, Self.remove)
        registry.beginBatch()
        #expect(registry.event(9) == .unpark)
        #expect(registry.event(9) == .stale)
        #expect(registry.parkedCount == 0 && registry.registeredCount == 0)
        registry.beginBatch()
        #expect(registry.event(9) == nil, "a new batch: an unknown socket")
        // A watched socket's event goes to libcurl.
        _ = registry.watch(5, Self.pollOut)
        _ = registry.applied(5, Self.pollOut, succeeded: true)
        #expect(registry.event(5) == .act)
    }

    @Test func aFailedChangeLeavesNoStaleRegistration() {
        var registry = SocketRegistry()
        #expect(registry.watch(4, Self.pollIn) == .watch(interest: Self.pollIn, add: true))
        #expect(registry.applied(4, Self.pollIn, succeeded: false) == .none, "never registered: nothing to remove")
        #expect(registry.registeredCount == 0)
        _ = registry.watch(4, Self.pollIn)
        _ = registry.applied(4, Self.pollIn, succeeded: true)
        #expect(registry.watch(4, Self.pollOut) == .watch(interest: Self.pollOut, add: false))
        #expect(registry.applied(4, Self.pollOut, succeeded: false) == .remove)
        #expect(registry.registeredCount == 0)
    }
}
