import ArgumentParser
import Foundation
import GRDB
import Glibc
import RelayCore
import RelayLocalBackend

/// `e2e --recorded N`: an events file holding N notifications' worth of recorded history, written once
/// through the relay's own events store and delivery log, and copied into each round's backend directory
/// before its relay opens it. Each notification is the bench's Apple renewal as the relay records it: a
/// renewal and a status change, and one successful delivery attempt of each. Its ids, user and
/// subscription are new and random, as a real history's are, so the indexes' entries land where a real
/// history's would.
struct RecordedHistory {
    let folder: String
    /// One consistent copy of the written events file, closed: what each round gets.
    var seed: String { folder + "/seed.sqlite" }

    static func build(notifications: Int, directory: String) async throws -> RecordedHistory {
        let history = RecordedHistory(folder: directory + "/relay-e2e-history-\(UUID().uuidString.prefix(8))")
        do {
            try FileManager.default.createDirectory(atPath: history.folder, withIntermediateDirectories: true)
            let backend = history.folder + "/backend.sqlite"
            let written = SubscriptionDatabase.eventsPath(forBackend: backend)
            try await record(notifications: notifications, backend: backend)
            // Through SQLite's backup, not a file copy: the written file's connections (its checkpointer's among
            // them) may still be closing, and the last to close checkpoints into it, holding its lock meanwhile.
            var configuration = Configuration()
            configuration.busyMode = .timeout(60)
            let source = try DatabaseQueue(path: written, configuration: configuration)
            let target = try DatabaseQueue(path: history.seed, configuration: configuration)
            try source.backup(to: target)
            try target.close()
            try source.close()
            for suffix in ["-wal", "-shm", "-journal"] where FileManager.default.fileExists(atPath: history.seed + suffix) {
                throw ValidationError("the history's copy left \(history.seed + suffix)")
            }
            // Only the seed is needed from here: the written files are as large again.
            for path in [backend, written] {
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
            }
        } catch {
            history.remove()
            throw error
        }
        return history
    }

    /// The seed's size in bytes.
    var bytes: Int { (try? FileManager.default.attributesOfItem(atPath: seed)[.size] as? Int) ?? 0 }

    /// Writes the history through the relay's own stores.
    private static func record(notifications: Int, backend: String) async throws {
        let database = try SubscriptionDatabase(path: backend)
        let events = EventStore(database: database)
        let deliveries = DeliveryLog(database: database)
        let batch = 2_000
        var written = 0
        while written < notifications {
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            var entries: [EventStore.Entry] = []
            var attempts: [[UInt8]] = []
            for _ in written..<min(written + batch, notifications) {
                let notification = UUID().uuidString.lowercased()
                let user = UUID().uuidString.lowercased()
                let subscription = String(Int.random(in: 100_000_000_000_000..<999_999_999_999_999))
                for type in ["renewal", "subscription_status_did_change"] {
                    let id = "apple:\(notification):\(type)"
                    let body = type == "renewal"
                        ? renewal(id: id, notification: notification, user: user, subscription: subscription, at: now)
                        : statusChange(id: id, notification: notification, user: user, subscription: subscription, at: now)
                    entries.append(EventStore.Entry(app: "bench", body: Array(body.utf8)))
                    // The deliverer's own record of a first, successful attempt (its id included).
                    let attempt = DeliveryAttempt(
                        app: "bench", endpoint: "bench", eventId: id, eventType: type, subject: subscription, attempt: 1, outcome: .succeeded,
                        httpStatus: 204, durationMs: 3, error: nil, startedAt: now + 18, finishedAt: now + 21)
                    attempts.append(attempt.json.serialized())
                }
            }
            let recorded = try await events.record(entries)
            let delivered = try await deliveries.record(attempts)
            guard recorded.invalid.isEmpty, recorded.inserted == entries.count, delivered.invalid.isEmpty, delivered.inserted == attempts.count else {
                throw ValidationError(
                    "the history's rows were not all recorded: \(recorded.inserted) events and \(delivered.inserted) attempts of \(entries.count)")
            }
            written += entries.count / 2
        }
    }

    /// Copies the seed to the events file of the backend database at `backend`, synced, before a relay opens it.
    func copy(toEventsFileOf backend: String) throws {
        let target = SubscriptionDatabase.eventsPath(forBackend: backend)
        try FileManager.default.createDirectory(
            atPath: URL(fileURLWithPath: target).deletingLastPathComponent().path, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: seed, toPath: target)
        // Synced, so the copy's writeback is not the relay's: its checkpoints' fsyncs would write it.
        let descriptor = open(target, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw ValidationError("cannot open \(target): errno \(errno)") }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else { throw ValidationError("cannot sync \(target): errno \(errno)") }
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: folder)
    }

    // The events below are the relay's own for the bench's Apple renewal (an `e2e` round's recorded rows).

    private static func renewal(id: String, notification: String, user: String, subscription: String, at time: Int64) -> String {
        #"{"applicationId":1,"data":{"bundleId":"com.example.app","cancelReason":null,"commissionPercentage":0.3,"countryCode":"US","currencyCode":"USD","entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"environment":"SANDBOX","exchangeRate":1.0,"expirationAt":\#(time + 2_592_000_000),"expirationReason":null,"gracePeriodExpiresAt":null,"id":"\#(id)","isFamilyShare":false,"isSmallBusiness":false,"isTrialConversion":false,"name":"renewal","newProductId":null,"offerCode":null,"originalAppUserId":"\#(user)","originalTransactionId":"\#(subscription)","periodType":"NORMAL","price":9.99,"priceInPurchasedCurrency":9.99,"proceeds":6.99,"productId":"com.example.pro.monthly","purchasedAt":\#(time),"sdkEvents":[],"sequence":1,"source":{"notificationId":"\#(notification)","store":"apple","subtype":null,"type":"DID_RENEW"},"store":"APP_STORE","subscriptionStatus":{"entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"status":"ACTIVE"},"takehomePercentage":0.7,"taxPercentage":null,"transactionId":"\#(subscription)1","ts":\#(time)},"object":"event","projectId":1,"timestamp":\#(time + 9),"type":"renewal"}"#
    }

    private static func statusChange(id: String, notification: String, user: String, subscription: String, at time: Int64) -> String {
        #"{"applicationId":1,"data":{"appUserId":"\#(user)","entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"environment":"SANDBOX","from":{"entitlements":[],"status":"INACTIVE"},"id":"\#(id)","name":"subscription_status_did_change","originalAppUserId":"\#(user)","originalTransactionId":"\#(subscription)","productId":"com.example.pro.monthly","sdkEvents":["subscriptionStatusDidChange"],"sequence":1,"source":{"notificationId":"\#(notification)","store":"apple","subtype":null,"type":"DID_RENEW"},"store":"APP_STORE","subscriptionStatus":{"entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"status":"ACTIVE"},"to":{"entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"status":"ACTIVE"},"ts":\#(time)},"object":"event","projectId":1,"timestamp":\#(time + 9),"type":"subscription_status_did_change"}"#
    }
}
