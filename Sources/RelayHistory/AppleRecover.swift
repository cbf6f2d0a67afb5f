import Foundation
import RelayAppStoreAPI
import RelayConfig
import RelayCore
import RelayVerification

extension AppleHistoryCommands {
    /// What `recover apple` did.
    public struct RecoverSummary: Sendable, Equatable {
        /// Notifications in Apple's history for the period.
        public var found = 0
        /// Of those, notifications whose events are already recorded.
        public var alreadyProcessed = 0
        /// Appended to the notifications topic for the worker.
        public var reingested = 0
        /// History items whose signedPayload could not be read (not appended).
        public var unreadable = 0
        /// Notifications that yield no events (`CONSUMPTION_REQUEST`, `TEST`): not re-ingested, since they
        /// always look unprocessed, and a re-ingested CONSUMPTION_REQUEST would be answered again with today's state.
        public var skipped = 0

        public init() {}
    }

    /// Get Notification History from `since` to `until` (Unix ms; `until` nil: now); each notification
    /// whose notificationUUID has no events in the events store is appended as the ingest would have
    /// appended it (`{"signedPayload": ...}`, no relay headers beyond the ingest's). One that yields no
    /// events (TEST, CONSUMPTION_REQUEST) is skipped: the events store cannot tell whether it was
    /// processed, and the worker would answer a CONSUMPTION_REQUEST again with today's state.
    public func recover(since: Int64, until: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure) -> RecoverSummary {
        let now = self.now()
        let days = Self.notificationHistoryDays(client.environment)
        let oldest = now - days * 86_400_000
        guard since >= oldest else {
            throw Failure(
                .badArguments,
                "--since \(Timestamp.rfc3339(milliseconds: since)) is older than the \(days) days of notification history Apple keeps"
                    + " (\(client.environment == .production ? "production" : "sandbox"));"
                    + " use --since \(Timestamp.rfc3339(milliseconds: oldest + 60_000)) or later, and `revenue-relay import apple` for older transactions")
        }
        let end = min(until ?? now, now)
        guard since < end else { throw Failure(.badArguments, "--since must be before --until (and before now)") }
        var summary = RecoverSummary()
        var seen = Set<String>()
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        try await loop.pages("the notification history") { token throws(AppStoreAPIError) in
            let page = try await client.notificationHistoryPage(NotificationHistoryRequest(startDate: since, endDate: end), paginationToken: token)
            return (page, page.hasMore ? page.paginationToken : nil)
        } failure: { error in
            Self.failure(error, what: "reading the notification history", done: "\(summary.reingested) notifications were re-ingested before")
        } each: { page, number throws(Failure) in
            var outgoing: [OutgoingRecord] = []
            for item in page.notificationHistory {
                summary.found += 1
                guard let payload = JWSPayload.decode(item.signedPayload), let uuid = payload["notificationUUID"]?.stringValue, !uuid.isEmpty else {
                    summary.unreadable += 1
                    logger.warning("a notification of Apple's history has no readable notificationUUID; not re-ingested")
                    continue
                }
                if let type = payload["notificationType"]?.stringValue, Self.yieldsNoEvents.contains(type) {
                    summary.skipped += 1
                    continue
                }
                guard seen.insert(uuid).inserted else {
                    summary.alreadyProcessed += 1
                    continue
                }
                if try await backend.hasEvents(notificationId: uuid) {
                    summary.alreadyProcessed += 1
                    continue
                }
                let body = JSON.object(["signedPayload": .string(item.signedPayload)]).serialized()
                let notification = RawNotification(store: .apple, app: app.key, receivedAtMilliseconds: self.now(), body: body, requestHeaders: [:])
                outgoing.append(notification.record(topic: topic))
            }
            if !outgoing.isEmpty {
                try await HistoryRun.append(outgoing, producer: producer, topic: topic, rerun: HistoryRun.recoverAgain)
                summary.reingested += outgoing.count
            }
            loop.report(
                summary.found, "notifications",
                "page \(number), \(summary.alreadyProcessed) already processed, \(summary.reingested) re-ingested, \(summary.skipped) skipped (no events)")
        }
        return summary
    }

    /// Notification types `recover` never re-ingests: they yield no events, so they always look unprocessed.
    static let yieldsNoEvents: Set<String> = ["CONSUMPTION_REQUEST", "TEST"]
}
