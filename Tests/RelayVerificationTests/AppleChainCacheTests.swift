import RelayCore
import RelayCrypto
import RelayTestSupport
@testable import RelayVerification
import Synchronization
import Testing

/// The verified chains' cache: found by the header's exact bytes only, within the chain's validity,
/// bounded with the expired and then the oldest going first.
@Suite struct AppleChainCacheTests {
    let key = Fixtures.privateKey("apple/leaf.key").publicKey
    let otherKey = Fixtures.privateKey("apple/rogue-leaf.key").publicKey

    /// A header of 5,000 bytes like an Apple one, with `mark` in its middle.
    func header(_ mark: UInt8, length: Int = 5_000) -> [UInt8] {
        var bytes = [UInt8](repeating: UInt8(ascii: "A"), count: length)
        bytes[length / 2] = mark
        return bytes
    }

    func lookup(_ cache: AppleChainCache, _ header: [UInt8], at time: Int64 = 150) -> PublicKey? {
        header.withUnsafeBytes { cache.lookup($0, at: time) }
    }

    @Test func aHeaderIsFoundByItsExactBytesOnly() {
        let cache = AppleChainCache(capacity: 8, prepare: { _ in })
        cache.insert(header(1), key: key, validity: 100..<200, now: 150)
        #expect(lookup(cache, header(1)) === key)
        // Same length, first 128 and last 64 bytes, so the same digest: compared in full.
        #expect(header(1).withUnsafeBytes { AppleChainCache.digest($0) } == header(2).withUnsafeBytes { AppleChainCache.digest($0) })
        #expect(lookup(cache, header(2)) == nil)
        #expect(lookup(cache, header(1, length: 5_001)) == nil)
        #expect(lookup(cache, Array(header(1).dropLast())) == nil)
        #expect(lookup(cache, []) == nil)
        cache.insert(header(2), key: otherKey, validity: 100..<200, now: 150)
        #expect(lookup(cache, header(2)) === otherKey && lookup(cache, header(1)) === key)
        // Short headers (under 64 bytes) have their whole text in the digest.
        cache.insert([1, 2, 3], key: otherKey, validity: 100..<200, now: 150)
        #expect(lookup(cache, [1, 2, 3]) === otherKey && lookup(cache, [1, 2]) == nil)
    }

    @Test func aChainServesOnlyTimesWithinItsValidity() {
        let cache = AppleChainCache(capacity: 8, prepare: { _ in })
        cache.insert(header(1), key: key, validity: 100..<200, now: 150)
        #expect(lookup(cache, header(1), at: 100) === key)
        #expect(lookup(cache, header(1), at: 199) === key)
        #expect(lookup(cache, header(1), at: 99) == nil)
        #expect(lookup(cache, header(1), at: 200) == nil)
        // Entered again (a later verification), the entry takes the new validity, once, and keeps its key: the
        // same bytes carry the same certificates, and the key may have its table already.
        cache.insert(header(1), key: otherKey, validity: 300..<400, now: 350)
        #expect(lookup(cache, header(1), at: 350) === key && lookup(cache, header(1), at: 150) == nil)
        #expect(cache.count == 1)
    }

    @Test func theExpiredAndThenTheOldestGoFirst() {
        let cache = AppleChainCache(capacity: 3, prepare: { _ in })
        cache.insert(header(1), key: key, validity: 0..<1_000, now: 10)
        cache.insert(header(2), key: key, validity: 0..<50, now: 10)
        cache.insert(header(3), key: key, validity: 0..<1_000, now: 10)
        #expect(cache.count == 3)
        // Over capacity at time 100: header 2 has expired and goes, the oldest stays.
        cache.insert(header(4), key: key, validity: 0..<1_000, now: 100)
        #expect(cache.count == 3)
        #expect(lookup(cache, header(1), at: 40) === key && lookup(cache, header(2), at: 40) == nil)
        // Nothing expired: the oldest goes.
        cache.insert(header(5), key: key, validity: 0..<1_000, now: 100)
        #expect(lookup(cache, header(1), at: 100) == nil)
        #expect([3, 4, 5].allSatisfy { lookup(cache, header(UInt8($0)), at: 100) === key })
    }

    /// A JWS that carries a genuine chain but whose signature fails leaves nothing in the cache; the same
    /// chain is entered once a JWS it signed verifies.
    @Test func onlyAHeaderWhoseSignatureVerifiedIsEntered() throws {
        let verifier = try AppleVerifier(app: "demo", configuration: #require(Fixtures.configuration().apps.first?.apple))
        let signer = AppleSigner()
        var other = signer
        other.key = Fixtures.privateKey("apple/rogue-leaf.key")
        #expect(throws: Rejection.self) { try verifier.verify(body: other.body(signer.notificationPayload())) }
        #expect(verifier.cachedChainCount == 0)
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        #expect(verifier.cachedChainCount == 1)
    }

    /// A chain's key is given to `prepare` once, when the chain is entered; the verifier's keys get their
    /// tables that way, and a forged signature is refused through the table as before it.
    @Test func eachChainEnteredHasItsKeysTableBuiltOnce() throws {
        let prepared = Mutex<[PublicKey]>([])
        let cache = AppleChainCache(capacity: 8, prepare: { key in prepared.withLock { $0.append(key) } })
        cache.insert(header(1), key: key, validity: 100..<200, now: 150)
        cache.insert(header(1), key: otherKey, validity: 100..<300, now: 150)
        cache.insert(header(2), key: otherKey, validity: 100..<200, now: 150)
        #expect(prepared.withLock { $0.count == 2 && $0[0] === key && $0[1] === otherKey })

        let built = Mutex(0)
        let verifier = try AppleVerifier(
            app: "demo", configuration: #require(Fixtures.configuration().apps.first?.apple), configurationKey: "apple",
            chainCacheCapacity: 64, prepareKeys: { key in if key.prepareFixedBaseTable() { built.withLock { $0 += 1 } } })
        let signer = AppleSigner()
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        #expect(built.withLock { $0 } == 1 && verifier.cachedChainCount == 1)
        // Verified through the table from now on: genuine notifications pass, forged ones do not.
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        var forger = signer
        forger.key = Fixtures.privateKey("apple/rogue-leaf.key")
        let rejection = #expect(throws: Rejection.self) { try verifier.verify(body: forger.body(signer.notificationPayload())) }
        #expect(rejection?.reason == .badSignature)
        #expect(built.withLock { $0 } == 1)
    }

    /// By default the table is built on a queue of its own once the chain is entered; the notifications
    /// verified meanwhile and after pass alike.
    @Test func byDefaultTheTableIsBuiltInTheBackground() throws {
        let verifier = try AppleVerifier(app: "demo", configuration: #require(Fixtures.configuration().apps.first?.apple))
        let signer = AppleSigner()
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        #expect(verifier.cachedChainCount == 1)
        // The queue is serial: once a block queued behind the build ran, the build has finished.
        AppleChainCache.preparing.sync {}
        #expect(verifier.cachedChainsWithTables == 1)
        _ = try verifier.verify(body: signer.body(signer.notificationPayload()))
        #expect(verifier.cachedChainsWithTables == 1 && verifier.cachedChainCount == 1)
    }

    @Test func aCacheOfNoCapacityKeepsNothing() {
        let cache = AppleChainCache(capacity: 0, prepare: { _ in })
        cache.insert(header(1), key: key, validity: 0..<1_000, now: 10)
        #expect(lookup(cache, header(1)) == nil && cache.count == 0)
    }
}
