import Foundation
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

    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
        do {
            return try await database.subscription(store: store, originalTransactionId: originalTransactionId)
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

    /// As the entitlements route's `customerInfo.subscriptions` entries that are active now.
    public func otherActiveSubscriptions(appUserId: String, excluding store: Store, originalTransactionId: String) async throws(BackendError)
        -> [SubscriptionState]
    {
        // As the entitlements route answers the secret key: every id linked to the user counts (`aliases`).
        var all: [SubscriptionState]
        do {
            let ids = try await database.allUserIds(of: [appUserId], applicationIds: nil)
            all = ids.count == 1
                ? try await database.subscriptions(ofUser: appUserId, excluding: (store, originalTransactionId))
                : try await database.subscriptions(ofUsers: ids)
        } catch {
            throw Self.unavailable("reading the subscriptions of a user", error)
        }
        all.removeAll { $0.store == store && $0.originalTransactionId == originalTransactionId }
        // The backend's clock, as the entitlements route's (tests give it theirs).
        let now = backend.clock()
        return all.filter { $0.isActive(at: now) }
    }

    public func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser {
        do {
            return try await database.appUser(id, applicationId: applicationId)
        } catch {
            throw Self.unavailable("reading the user of an id", error)
        }
    }

    /// A database failure (disk full, I/O error): retriable, as an unreachable backend is.
    private static func unavailable(_ what: String, _ error: any Error) -> BackendError {
        BackendError(kind: .unavailable, message: "the local backend's database failed \(what): \(error)")
    }
}
