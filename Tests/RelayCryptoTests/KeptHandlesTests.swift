@testable import RelayCrypto
import Synchronization
import Testing

/// The pool behind the verification contexts and the tables' big-number contexts: at most its limit kept,
/// the rest and a failed use's released at once, the kept ones released with the pool.
@Suite struct KeptHandlesTests {
    @Test func keepsUpToItsLimitAndReleasesTheRest() throws {
        let released = Mutex<[UInt]>([])
        let handles = (1...4).map { OpaquePointer(bitPattern: UInt($0) * 16)! }
        do {
            let pool = KeptHandles(limit: 2, release: { pointer in released.withLock { $0.append(UInt(bitPattern: pointer)) } })
            #expect(pool.take() == nil)
            handles.prefix(3).forEach(pool.giveBack)
            #expect(pool.count == 2 && released.withLock { $0 } == [48])
            #expect(pool.take() == handles[1] && pool.count == 1)
            pool.discard(handles[1])
            #expect(released.withLock { $0 } == [48, 32])
            pool.giveBack(handles[3])
        }
        // The pool is gone: the two it kept are released with it.
        #expect(released.withLock { Set($0) } == [48, 32, 16, 64] && released.withLock { $0.count } == 4)
    }
}
