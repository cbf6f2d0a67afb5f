import Foundation
import GRDB
import RelayConfig
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

@Suite struct SubscriptionDatabaseTests {
    @Test func concurrentWritesAreCommittedTogetherAndEachIsCheckedAgainstItsVersion() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path)
        // Durable on power loss, not only on a crash: the writer's commits are fsynced.
        #expect(try database.commitsAreSynced())

        // 40 writers at once: 20 create distinct subscriptions, 20 race to create the same one.
        let outcomes = try await withThrowingTaskGroup(of: (String, SubscriptionDatabase.WriteOutcome).self) { group in
            for index in 0..<20 {
                group.addTask { ("own", try await database.write(testSubscriptionState("own-\(index)", user: "owner-\(index)", at: 1_000), ifMatch: 0)) }
                group.addTask { ("shared", try await database.write(testSubscriptionState("shared", user: "user-\(index)", at: 1_000), ifMatch: 0)) }
            }
            return try await group.reduce(into: [(String, SubscriptionDatabase.WriteOutcome)]()) { $0.append($1) }
        }
        let own = outcomes.filter { $0.0 == "own" }.map(\.1)
        #expect(own.allSatisfy { if case .written(let stored) = $0 { stored.version == 1 } else { false } })
        let shared = outcomes.filter { $0.0 == "shared" }.map(\.1)
        let written = shared.compactMap { outcome -> SubscriptionState? in if case .written(let stored) = outcome { stored } else { nil } }
        #expect(written.count == 1)
        // The others were told who won, and nothing of theirs was stored.
        #expect(shared.filter { if case .versionMismatch(let current) = $0 { current?.version == 1 } else { false } }.count == 19)
        let stored = try await database.subscription(store: .apple, originalTransactionId: "shared")
        #expect(stored == written.first)
        #expect(try await database.subscriptions(ofUser: written.first!.originalAppUserId!).map(\.originalTransactionId) == ["shared"])

        // A later write moves the version on, once per write.
        guard case .written(let second) = try await database.write(testSubscriptionState("shared", at: 2_000), ifMatch: 1) else {
            Issue.record("not written")
            return
        }
        #expect(second.version == 2)
        // One write that fails (refused, it must name the stored state, whose row no longer decodes) fails
        // alone; the writes committed with it land. (A write that goes through never decodes the stored state.)
        let raw = try DatabaseQueue(path: path)
        try await raw.write { db in try db.execute(sql: "UPDATE subscription SET state = '{\"broken\": true}' WHERE original_transaction_id = 'own-3'") }
        let mixed = await withTaskGroup(of: (String, Bool).self) { group in
            group.addTask { ("own-3", (try? await database.write(testSubscriptionState("own-3", user: "owner-3", at: 3_000), ifMatch: 0)) != nil) }
            for index in 20..<40 {
                group.addTask { ("own-\(index)", (try? await database.write(testSubscriptionState("own-\(index)", user: "owner-\(index)", at: 3_000), ifMatch: 0)) != nil) }
            }
            return await group.reduce(into: [String: Bool]()) { $0[$1.0] = $1.1 }
        }
        #expect(mixed["own-3"] == false)
        #expect(mixed.filter { $0.key != "own-3" }.values.allSatisfy { $0 }, "\(mixed.filter { !$0.value })")
        // A write that names the stored version goes through without decoding the old row, and replaces it.
        guard case .written(let repaired) = try await database.write(testSubscriptionState("own-3", user: "owner-3", at: 3_000), ifMatch: 1) else {
            Issue.record("the write over the broken row was refused")
            return
        }
        #expect(repaired.version == 2)
        #expect(try await database.subscription(store: .apple, originalTransactionId: "own-3") == repaired)

        // A user's other subscriptions leave out the one named.
        #expect(try await database.subscriptions(ofUser: "owner-1").map(\.originalTransactionId) == ["own-1"])
        #expect(try await database.subscriptions(ofUser: "owner-1", excluding: (.apple, "own-1")).isEmpty)
    }

    @Test func aWriteRefusedOrStaleStoresNothingAndTheUsersFollowTheState() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path)
        let first = try await database.write(testSubscriptionState("sub", user: "user-a", at: 1_000), ifMatch: 0)
        guard case .written(let stored) = first else { Issue.record("not written: \(first)"); return }

        // Refused: the wrong version names the stored state; older in source time is stale. Neither changes it.
        #expect(try await database.write(testSubscriptionState("sub", user: "user-b", at: 2_000), ifMatch: 0) == .versionMismatch(current: stored))
        #expect(try await database.write(testSubscriptionState("sub", user: "user-b", at: 500), ifMatch: 1) == .stale(current: stored))
        #expect(try await database.subscription(store: .apple, originalTransactionId: "sub") == stored)
        #expect(try await database.subscriptions(ofUser: "user-b").isEmpty)

        // A renewal of the same user keeps it that user's; a new owner takes it from the first.
        guard case .written = try await database.write(testSubscriptionState("sub", user: "user-a", at: 2_000), ifMatch: 1) else {
            Issue.record("the renewal was not written")
            return
        }
        #expect(try await database.subscriptions(ofUser: "user-a").map(\.version) == [2])
        guard case .written = try await database.write(testSubscriptionState("sub", user: "user-b", at: 3_000), ifMatch: 2) else {
            Issue.record("the new owner's state was not written")
            return
        }
        #expect(try await database.subscriptions(ofUser: "user-a").isEmpty)
        #expect(try await database.subscriptions(ofUser: "user-b").map(\.version) == [3])
    }
}

/// The in-process backend checks a state without a JSON round trip: the check must agree with the decoder.
