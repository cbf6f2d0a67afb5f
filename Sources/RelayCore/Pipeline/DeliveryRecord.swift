/// Header names of `relay.deliveries` records and of the retry and dead-letter topics after them
/// (docs/delivery.md). Besides these, every delivery record carries `relay-event-id`,
/// `relay-event-type` and `relay-app`.
public enum DeliveryHeaderName {
    /// The endpoint's configured `id`.
    public static let endpoint = "relay-endpoint"
    /// Attempts made so far (absent or 0 on a fresh delivery).
    public static let attempts = "relay-attempts"
    /// When the first and the latest attempt started, RFC 3339 UTC with milliseconds.
    public static let firstAttemptAt = "relay-first-attempt-at"
    public static let lastAttemptAt = "relay-last-attempt-at"
    /// The latest attempt's HTTP status; absent when it got no response.
    public static let lastStatus = "relay-last-status"
    /// What went wrong with the latest attempt: `HTTP 500`, `timeout: …`, `connect: …`, `address_refused: …`.
    public static let lastError = "relay-last-error"
    /// The latest response's body, truncated to `DeliveryRecord.maxResponseBytes` (dead-letter records).
    public static let lastResponse = "relay-last-response"
    /// On retry records: when the next attempt is due, Unix milliseconds.
    public static let dueAt = "relay-due-at"
    /// On dead-letter records: why (`retries_exhausted`, `endpoint_gone`, `endpoint_disabled`,
    /// `endpoint_unknown`, `malformed`).
    public static let deadLetterReason = "relay-dead-letter-reason"
    /// On dead-letter records: when, RFC 3339 UTC with milliseconds.
    public static let deadLetteredAt = "relay-dead-lettered-at"
    /// On replayed records: the dead-letter record they came from, `<topic>:<partition>:<offset>`.
    public static let replayedFrom = "relay-replayed-from"
}

/// Why a delivery went to the dead-letter topic.
public enum DeadLetterReason: String, Sendable, CaseIterable {
    /// Every step of the retry schedule failed.
    case retriesExhausted = "retries_exhausted"
    /// The endpoint answered 410 Gone: it is disabled in this deliverer until restart or a replay succeeds.
    case endpointGone = "endpoint_gone"
    /// The endpoint answered 410 Gone earlier; later deliveries skip it.
    case endpointDisabled = "endpoint_disabled"
    /// No endpoint with the record's id is configured (removed from the configuration).
    case endpointUnknown = "endpoint_unknown"
    /// The record lacks the delivery headers (not written by revenue-relay).
    case malformed
}

/// One delivery as carried by a `relay.deliveries`, retry or dead-letter record: the webhook body
/// (the record's value), its identity, and how its attempts went so far.
public struct DeliveryRecord: Sendable {
    /// Response bytes kept in `relay-last-response`.
    public static let maxResponseBytes = 1024

    public var key: [UInt8]?
    public var body: [UInt8]
    public var endpointID: String
    /// The event's stable id: `webhook-id` of every attempt.
    public var eventID: String
    public var eventType: String
    public var app: String
    public var attempts: Int
    public var firstAttemptAt: Int64?
    public var lastAttemptAt: Int64?
    public var lastStatus: Int?
    public var lastError: String?
    public var lastResponse: String?
    public var dueAt: Int64?
    public var replayedFrom: String?
    public var deadLetterReason: String?
    public var deadLetteredAt: Int64?

    /// Reads a record written by the fan-out, the deliverer or `replay`; nil when the identity headers
    /// are missing.
    public init?(_ record: ConsumedRecord) {
        // One pass over the headers (this runs for every record); the first of a name counts, even
        // when its value is not UTF-8 (then the field is absent).
        var endpoint: String??, eventID: String??, eventType: String??, app: String??, attempts: String??
        var firstAttemptAt: String??, lastAttemptAt: String??, lastStatus: String??, lastError: String??
        var lastResponse: String??, dueAt: String??, replayedFrom: String??, deadLetterReason: String??, deadLetteredAt: String??
        for header in record.headers {
            func take(_ slot: inout String??) {
                if slot == nil { slot = .some(header.stringValue) }
            }
            switch header.name {
            case DeliveryHeaderName.endpoint: take(&endpoint)
            case RelayHeaderName.eventId: take(&eventID)
            case RelayHeaderName.eventType: take(&eventType)
            case RelayHeaderName.app: take(&app)
            case DeliveryHeaderName.attempts: take(&attempts)
            case DeliveryHeaderName.firstAttemptAt: take(&firstAttemptAt)
            case DeliveryHeaderName.lastAttemptAt: take(&lastAttemptAt)
            case DeliveryHeaderName.lastStatus: take(&lastStatus)
            case DeliveryHeaderName.lastError: take(&lastError)
            case DeliveryHeaderName.lastResponse: take(&lastResponse)
            case DeliveryHeaderName.dueAt: take(&dueAt)
            case DeliveryHeaderName.replayedFrom: take(&replayedFrom)
            case DeliveryHeaderName.deadLetterReason: take(&deadLetterReason)
            case DeliveryHeaderName.deadLetteredAt: take(&deadLetteredAt)
            default: break
            }
        }
        guard let endpoint = endpoint ?? nil, !endpoint.isEmpty, let eventID = eventID ?? nil, !eventID.isEmpty else { return nil }
        self.key = record.key
        self.body = record.value
        self.endpointID = endpoint
        self.eventID = eventID
        self.eventType = (eventType ?? nil) ?? ""
        self.app = (app ?? nil) ?? ""
        self.attempts = (attempts ?? nil).flatMap { Int($0) }.map { max(0, $0) } ?? 0
        self.firstAttemptAt = Timestamp.milliseconds(firstAttemptAt ?? nil)
        self.lastAttemptAt = Timestamp.milliseconds(lastAttemptAt ?? nil)
        self.lastStatus = (lastStatus ?? nil).flatMap { Int($0) }
        self.lastError = lastError ?? nil
        self.lastResponse = lastResponse ?? nil
        self.dueAt = (dueAt ?? nil).flatMap { Int64($0) }
        self.replayedFrom = replayedFrom ?? nil
        self.deadLetterReason = deadLetterReason ?? nil
        self.deadLetteredAt = Timestamp.milliseconds(deadLetteredAt ?? nil)
    }

    /// A new delivery as the fan-out writes it to `relay.deliveries`: keyed `<endpoint id>:<subject>`,
    /// the event's payload as the body, the identity headers and no attempts yet.
    public static func fresh(
        topic: String, endpoint: String, subject: String, body: [UInt8], eventID: String, eventType: String, app: String
    ) -> OutgoingRecord {
        OutgoingRecord(
            topic: topic, key: Array("\(endpoint):\(subject)".utf8), value: body,
            headers: [
                RecordHeader(name: DeliveryHeaderName.endpoint, value: endpoint),
                RecordHeader(name: RelayHeaderName.eventId, value: eventID),
                RecordHeader(name: RelayHeaderName.eventType, value: eventType),
                RecordHeader(name: RelayHeaderName.app, value: app),
            ])
    }

    /// When a record on a retry topic may be attempted (Unix milliseconds); nil for at once.
    public static func dueTime(of record: ConsumedRecord) -> Int64? {
        record.headers.first(named: DeliveryHeaderName.dueAt)?.stringValue.flatMap { Int64($0) }
    }

    /// The identity headers every copy keeps.
    private var identityHeaders: [RecordHeader] {
        var headers = [
            RecordHeader(name: DeliveryHeaderName.endpoint, value: endpointID),
            RecordHeader(name: RelayHeaderName.eventId, value: eventID),
            RecordHeader(name: RelayHeaderName.eventType, value: eventType),
            RecordHeader(name: RelayHeaderName.app, value: app),
        ]
        if let replayedFrom { headers.append(RecordHeader(name: DeliveryHeaderName.replayedFrom, value: replayedFrom)) }
        return headers
    }

    private var attemptHeaders: [RecordHeader] {
        var headers = [RecordHeader(name: DeliveryHeaderName.attempts, value: String(attempts))]
        if let firstAttemptAt { headers.append(RecordHeader(name: DeliveryHeaderName.firstAttemptAt, value: Timestamp.rfc3339(milliseconds: firstAttemptAt))) }
        if let lastAttemptAt { headers.append(RecordHeader(name: DeliveryHeaderName.lastAttemptAt, value: Timestamp.rfc3339(milliseconds: lastAttemptAt))) }
        if let lastStatus { headers.append(RecordHeader(name: DeliveryHeaderName.lastStatus, value: String(lastStatus))) }
        if let lastError { headers.append(RecordHeader(name: DeliveryHeaderName.lastError, value: lastError)) }
        return headers
    }

    /// This delivery on a retry topic, due at `due`.
    public func retryRecord(topic: String, due: Int64) -> OutgoingRecord {
        OutgoingRecord(
            topic: topic, key: key, value: body,
            headers: identityHeaders + attemptHeaders + [RecordHeader(name: DeliveryHeaderName.dueAt, value: String(due))])
    }

    /// This delivery on the dead-letter topic.
    public func deadLetterRecord(topic: String, reason: DeadLetterReason, at time: Int64) -> OutgoingRecord {
        var headers = identityHeaders + attemptHeaders
        if let lastResponse { headers.append(RecordHeader(name: DeliveryHeaderName.lastResponse, value: lastResponse)) }
        headers.append(RecordHeader(name: DeliveryHeaderName.deadLetterReason, value: reason.rawValue))
        headers.append(RecordHeader(name: DeliveryHeaderName.deadLetteredAt, value: Timestamp.rfc3339(milliseconds: time)))
        return OutgoingRecord(topic: topic, key: key, value: body, headers: headers)
    }

    /// A dead-lettered delivery sent back to `relay.deliveries` by `replay`: same key, body and
    /// event id (so the same `webhook-id`), a fresh attempt count, and where it came from.
    public func replayRecord(topic: String, from position: String) -> OutgoingRecord {
        var copy = self
        copy.replayedFrom = position
        return OutgoingRecord(topic: topic, key: key, value: body, headers: copy.identityHeaders)
    }

    /// Response text for `relay-last-response`: at most `maxResponseBytes` bytes of valid UTF-8.
    public static func truncatedResponse(_ body: [UInt8]) -> String? {
        guard !body.isEmpty else { return nil }
        var text = String(decoding: body.prefix(maxResponseBytes), as: UTF8.self)
        while text.utf8.count > maxResponseBytes { text.removeLast() }
        return text
    }
}
