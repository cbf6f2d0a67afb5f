/// One webhook attempt, as the deliverer writes it to the delivery log's topic (`topics.attempts`), or hands it
/// to the delivery log in its process (`DeliveryLogRecorder`), and the local backend records it: which
/// endpoint and event, the attempt's number, what came of it and when, so that an event's first attempt, its
/// retries, its dead letter and its replays read as one timeline.
public struct DeliveryAttempt: Sendable, Equatable {
    public enum Outcome: String, Sendable, CaseIterable {
        /// A 2xx.
        case succeeded
        /// Failed; the delivery waits on a retry topic for its next attempt.
        case retrying
        /// Failed for the last time (or the endpoint answered 410, or is disabled): dead-lettered.
        case dead
        /// The endpoint answered 429 or 503 with `Retry-After`: it is paused, and the same attempt (not spent)
        /// goes again after the pause.
        case throttled
    }

    public var app: String
    public var endpoint: String
    public var eventId: String
    public var eventType: String
    /// The subscription (the delivery's key without its endpoint).
    public var subject: String?
    /// 1 for the first attempt; a replay starts again at 1 (`replayedFrom` says from which dead letter).
    public var attempt: Int
    public var outcome: Outcome
    public var httpStatus: Int?
    /// How long the attempt took, in milliseconds.
    public var durationMs: Int64?
    public var error: String?
    /// When it started and finished (Unix ms).
    public var startedAt: Int64
    public var finishedAt: Int64
    public var replayedFrom: String?
    /// When it will be tried again (`retrying`), or why it was dead-lettered (`dead`).
    public var nextAttemptAt: Int64?
    public var deadLetterReason: String?

    public init(
        app: String, endpoint: String, eventId: String, eventType: String, subject: String?, attempt: Int, outcome: Outcome, httpStatus: Int?,
        durationMs: Int64?, error: String?, startedAt: Int64, finishedAt: Int64, replayedFrom: String? = nil, nextAttemptAt: Int64? = nil,
        deadLetterReason: String? = nil
    ) {
        self.app = app
        self.endpoint = endpoint
        self.eventId = eventId
        self.eventType = eventType
        self.subject = subject
        self.attempt = attempt
        self.outcome = outcome
        self.httpStatus = httpStatus
        self.durationMs = durationMs
        self.error = error
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.replayedFrom = replayedFrom
        self.nextAttemptAt = nextAttemptAt
        self.deadLetterReason = deadLetterReason
    }

    /// The attempt's id: the same attempt written twice (a deliverer's retry of its produce) is one row; an
    /// unsent dead letter after attempt N, or attempt N sent again after a crash with another outcome, is
    /// another.
    /// A throttled attempt keeps its number, so its id carries its start too.
    public var id: String {
        let base = "\(endpoint):\(eventId):\(replayedFrom ?? "-"):\(attempt):\(outcome.rawValue)"
        return outcome == .throttled ? "\(base):\(startedAt)" : base
    }

    /// The longest `error` kept (a transport error's message can be long).
    public static let maximumErrorLength = 500

    public var json: JSON {
        func optional(_ value: String?) -> JSON { value.map(JSON.string) ?? .null }
        func optional(_ value: Int64?) -> JSON { value.map(JSON.integer) ?? .null }
        return [
            "id": .string(id), "app": .string(app), "endpoint": .string(endpoint), "eventId": .string(eventId), "eventType": .string(eventType),
            "subject": optional(subject), "attempt": .integer(Int64(attempt)), "outcome": .string(outcome.rawValue),
            "httpStatus": optional(httpStatus.map(Int64.init)), "durationMs": optional(durationMs), "error": optional(error),
            "startedAt": .integer(startedAt), "finishedAt": .integer(finishedAt), "replayedFrom": optional(replayedFrom),
            "nextAttemptAt": optional(nextAttemptAt), "deadLetterReason": optional(deadLetterReason),
        ]
    }

    public init?(json: JSON) {
        guard let app = json["app"]?.stringValue, let endpoint = json["endpoint"]?.stringValue, let eventId = json["eventId"]?.stringValue,
            let eventType = json["eventType"]?.stringValue, let attempt = json["attempt"]?.int64Value,
            let outcome = json["outcome"]?.stringValue.flatMap(Outcome.init(rawValue:)), let startedAt = json["startedAt"]?.int64Value,
            let finishedAt = json["finishedAt"]?.int64Value
        else { return nil }
        self.init(
            app: app, endpoint: endpoint, eventId: eventId, eventType: eventType, subject: json["subject"]?.stringValue, attempt: Int(attempt),
            outcome: outcome, httpStatus: json["httpStatus"]?.int64Value.map(Int.init), durationMs: json["durationMs"]?.int64Value,
            error: json["error"]?.stringValue, startedAt: startedAt, finishedAt: finishedAt, replayedFrom: json["replayedFrom"]?.stringValue,
            nextAttemptAt: json["nextAttemptAt"]?.int64Value, deadLetterReason: json["deadLetterReason"]?.stringValue)
    }

    /// `json.serialized()`'s bytes, written without building the tree (members in name order): every
    /// webhook attempt is written once.
    public func serialized() -> [UInt8] {
        var writer = JSONMembersWriter(capacity: 512)
        writer.open()
        writer.member("app", string: app)
        writer.member("attempt", .integer(Int64(attempt)))
        writer.member("deadLetterReason", optional: deadLetterReason)
        writer.member("durationMs", optional: durationMs)
        writer.member("endpoint", string: endpoint)
        writer.member("error", optional: error)
        writer.member("eventId", string: eventId)
        writer.member("eventType", string: eventType)
        writer.member("finishedAt", .integer(finishedAt))
        writer.member("httpStatus", optional: httpStatus.map(Int64.init))
        writer.member("id", string: id)
        writer.member("nextAttemptAt", optional: nextAttemptAt)
        writer.member("outcome", string: outcome.rawValue)
        writer.member("replayedFrom", optional: replayedFrom)
        writer.member("startedAt", .integer(startedAt))
        writer.member("subject", optional: subject)
        writer.close()
        return writer.output
    }

    /// The record on the delivery log's topic, keyed by its endpoint (one endpoint's attempts in order).
    public func record(topic: String) -> OutgoingRecord {
        OutgoingRecord(topic: topic, key: Array(endpoint.utf8), value: serialized(), headers: [])
    }
}

/// One record of the delivery log as the deliverer makes it: an attempt, or an endpoint's state.
public enum DeliveryLogEntry: Sendable, Equatable {
    case attempt(DeliveryAttempt)
    case status(EndpointStatus)
}

/// The delivery log in the deliverer's own process (the local backend's, when one process runs both roles): it
/// records the deliverer's attempts and endpoint states itself, so they skip `topics.attempts` (appended,
/// read back by the backend's recorder, parsed again). They are handed over as values, not as the topic's
/// bytes: nothing is serialized to be parsed again in the same process.
public protocol DeliveryLogRecorder: Sendable {
    /// Records `entries` in one transaction; throws when it could not.
    func recordFromDeliverer(_ entries: [DeliveryLogEntry]) async throws(DeliveryLogWriteError)
}

/// Why the delivery log in the deliverer's process did not record a batch.
public struct DeliveryLogWriteError: Error, Sendable, CustomStringConvertible {
    public var reason: String
    /// Whether the same batch may be recorded later (the database busy, the disk full or failing); if not, the
    /// deliverer drops it and counts it, so the next ones are not held behind it.
    public var isRetriable: Bool

    public init(reason: String, isRetriable: Bool) {
        self.reason = reason
        self.isRetriable = isRetriable
    }

    public var description: String { reason }
}

/// An endpoint's state as a deliverer holds it, written to the delivery log's topic (beside the attempts,
/// keyed by the endpoint), or handed to the delivery log in its process, when it changes and when the
/// deliverer starts: whether its circuit breaker is open, whether a 410 disabled it, and until when a
/// `Retry-After` pauses it. The backend keeps the latest for the endpoints route.
public struct EndpointStatus: Sendable, Equatable {
    public var endpoint: String
    public var app: String
    public var circuitOpen: Bool
    public var disabled: Bool
    /// Unix ms; nil when not paused.
    public var pausedUntil: Int64?
    /// When the deliverer reported it (Unix ms).
    public var at: Int64

    public init(endpoint: String, app: String, circuitOpen: Bool, disabled: Bool, pausedUntil: Int64?, at: Int64) {
        self.endpoint = endpoint
        self.app = app
        self.circuitOpen = circuitOpen
        self.disabled = disabled
        self.pausedUntil = pausedUntil
        self.at = at
    }

    static let kind = "endpointStatus"

    public var json: JSON {
        [
            "kind": .string(Self.kind), "endpoint": .string(endpoint), "app": .string(app), "circuit": .string(circuitOpen ? "open" : "closed"),
            "disabled": .bool(disabled), "pausedUntil": pausedUntil.map(JSON.integer) ?? .null, "at": .integer(at),
        ]
    }

    public init?(json: JSON) {
        guard json["kind"]?.stringValue == Self.kind, let endpoint = json["endpoint"]?.stringValue, let app = json["app"]?.stringValue,
            let circuit = json["circuit"]?.stringValue, let disabled = json["disabled"]?.boolValue, let at = json["at"]?.int64Value
        else { return nil }
        self.init(endpoint: endpoint, app: app, circuitOpen: circuit == "open", disabled: disabled, pausedUntil: json["pausedUntil"]?.int64Value, at: at)
    }

    public func record(topic: String) -> OutgoingRecord {
        OutgoingRecord(topic: topic, key: Array(endpoint.utf8), value: json.serialized(), headers: [])
    }
}

/// Instructions to the deliverers, written to every partition of `relay.deliveries` (so each deliverer
/// process, whichever partitions it holds, reads one): a record with `relay-control` and `relay-endpoint`
/// and an empty body. Not a delivery: nothing is sent.
public enum DeliveryControl: String, Sendable {
    /// Enable the endpoint a 410 Gone disabled (`POST .../endpoints/{id}/enable`).
    case enable

    public static let header = "relay-control"

    /// One record per partition (`partitions` of the deliveries topic).
    public func records(topic: String, endpoint: String, partitions: Int) -> [OutgoingRecord] {
        (0..<max(1, partitions)).map { partition in
            OutgoingRecord(
                topic: topic, key: nil, value: [],
                headers: [RecordHeader(name: Self.header, value: rawValue), RecordHeader(name: DeliveryHeaderName.endpoint, value: endpoint)],
                partition: Int32(partition))
        }
    }
}
