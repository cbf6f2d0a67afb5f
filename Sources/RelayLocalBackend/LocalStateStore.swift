import Foundation
import GRDB
import RelaySQLite
public import RelayCore

/// The worker's state store when the local backend runs in the same process (`dev`, `run` with every
/// role): the same database and rules the backend's HTTP routes serve, without the loopback HTTP round
/// trips (two per notification, each a JSON encode and decode on both sides). A worker in another process
/// uses the routes (`BackendStateStore`), whose contract is unchanged.
public struct LocalStateStore: SubscriptionStateStore {
    let backend: LocalBackend
    let database: SubscriptionDatabase

    public init(backend: LocalBackend, database: SubscriptionDatabase) {
        self.backend = backend
        self.database = database
    }

    public func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping {
        // As over HTTP: an application without products unlocks nothing.
        backend.productMapping(applicationId: applicationId) ?? ProductMapping(products: [])
    }

    /// On the writer's connection, as all the worker's reads are (`readBetweenCommits`).
    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
        do {
            return try await database.pool.readBetweenCommits { db in try SubscriptionDatabase.fetch(db, store: store.rawValue, id: originalTransactionId) }
        } catch {
            throw Self.unavailable("reading subscription \(store.rawValue)/\(originalTransactionId)", error)
        }
    }

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
        // What the PUT route refuses with 400 is refused here too: a state stored without this check
        // could never be read again.
        if let problem = state.storageProblem {
            throw BackendError(kind: .badRequest, message: "subscription \(state.store.rawValue)/\(state.originalTransactionId): \(problem)")
        }
        let outcome: SubscriptionDatabase.WriteOutcome
        do {
            outcome = try await database.write(state, ifMatch: ifMatch)
        } catch {
            throw Self.unavailable("writing subscription \(state.store.rawValue)/\(state.originalTransactionId)", error)
        }
        switch outcome {
        case .written(let stored): return .written(stored)
        case .versionMismatch: return .versionMismatch
        case .stale(let current): return .stale(current: current)
        }
    }

    /// The user and its other active subscriptions (as the entitlements route's `customerInfo.subscriptions`
    /// entries that are active now) in one read transaction: each read of its own is two thread hops and its
    /// pages read again. On the writer's connection, as all the worker's reads are (`readBetweenCommits`).
    public func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
        async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
    {
        // As over HTTP, where the routes refuse such an id: a user of its own (`AppUser.hasControlCharacters`).
        guard !AppUser.hasControlCharacters(id) else { return (AppUser(appUserId: id), []) }
        do {
            let (user, all) = try await database.pool.readBetweenCommits { db in
                (try SubscriptionDatabase.appUser(db, id, applicationId: applicationId),
                 try Self.subscriptions(db, ofUserIds: id, excluding: (store, originalTransactionId)))
            }
            return (user, activeOthers(all, excluding: store, originalTransactionId))
        } catch {
            throw Self.unavailable("reading the user of an id and its subscriptions", error)
        }
    }

    /// The state and, in the same read transaction, the likely user's `appUserAndOtherActiveSubscriptions`: for
    /// most notifications the worker then needs no second read (two thread hops and the pages read again).
    /// On the writer's connection, whose cache holds the pages the last writes touched (`readBetweenCommits`:
    /// at saturation this cut the relay's CPU per notification by 7–13% in six alternating pairs,
    /// docs/benchmarks.md).
    public func subscriptionReadingAhead(store: Store, originalTransactionId: String, likelyUser: String?, applicationId: Int)
        async throws(BackendError) -> (state: SubscriptionState?, user: UserReadAhead?)
    {
        do {
            let (state, read) = try await database.pool.readBetweenCommits { db -> (SubscriptionState?, (String, AppUser, [SubscriptionState])?) in
                let state = try SubscriptionDatabase.fetch(db, store: store.rawValue, id: originalTransactionId)
                guard let id = likelyUser ?? state?.entitledUser, !AppUser.hasControlCharacters(id) else { return (state, nil) }
                // Best effort: a failure here (a state of the user's that no longer decodes) is for the separate
                // read to report, if the notification needs that user at all.
                guard let user = try? SubscriptionDatabase.appUser(db, id, applicationId: applicationId),
                    let others = try? Self.subscriptions(db, ofUserIds: id, excluding: (store, originalTransactionId))
                else { return (state, nil) }
                return (state, (id, user, others))
            }
            return (state, read.map { UserReadAhead(id: $0.0, user: $0.1, active: activeOthers($0.2, excluding: store, originalTransactionId)) })
        } catch {
            throw Self.unavailable("reading subscription \(store.rawValue)/\(originalTransactionId)", error)
        }
    }

    /// As the entitlements route answers the secret key: every id linked to the user counts (`aliases`).
    private static func subscriptions(_ db: Database, ofUserIds appUserId: String, excluding: (store: Store, originalTransactionId: String))
        throws -> [SubscriptionState]
    {
        let ids = try SubscriptionDatabase.allUserIds(db, of: [appUserId], applicationIds: nil)
        return ids.count == 1
            ? try SubscriptionDatabase.subscriptions(db, ofUser: appUserId, excluding: excluding)
            : try SubscriptionDatabase.subscriptions(db, ofUsers: ids)
    }

    private func activeOthers(_ all: [SubscriptionState], excluding store: Store, _ originalTransactionId: String) -> [SubscriptionState] {
        // The backend's clock, as the entitlements route's (tests give it theirs).
        let now = backend.clock()
        return all.filter { $0.isActive(at: now) && !($0.store == store && $0.originalTransactionId == originalTransactionId) }
    }

    /// On the writer's connection, as all the worker's reads are (`readBetweenCommits`).
    public func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser {
        guard !AppUser.hasControlCharacters(id) else { return AppUser(appUserId: id) }
        do {
            return try await database.pool.readBetweenCommits { db in try SubscriptionDatabase.appUser(db, id, applicationId: applicationId) }
        } catch {
            throw Self.unavailable("reading the user of an id", error)
        }
    }

    /// A database failure (disk full, I/O error): retriable, as an unreachable backend is.
    private static func unavailable(_ what: String, _ error: any Error) -> BackendError {
        BackendError(kind: .unavailable, message: "the local backend's database failed \(what): \(error)")
    }
}
