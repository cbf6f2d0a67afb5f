/// Header names of the raw notification record (docs/contracts.md, the raw notification record).
public enum RelayHeaderName {
    public static let store = "relay-store"
    public static let app = "relay-app"
    public static let receivedAt = "relay-received-at"
    public static let rejectReason = "relay-reject-reason"
    public static let rejectDetail = "relay-reject-detail"
    /// On `relay.events` records: the event's `data.id` and `type` (so consumers can route without parsing).
    public static let eventId = "relay-event-id"
    public static let eventType = "relay-event-type"
    /// On `relay.events` records of an import (`revenue-relay import`): `true`. Such events are recorded
    /// as historical and are not delivered unless the import asked for it.
    public static let historical = "relay-historical"
    /// On raw notification records the relay's own commands synthesized: where the body comes from.
    /// `apple-api` (`RawNotification.appleAPISource`): a transaction from the App Store Server API
    /// (`revenue-relay import apple`, `reconcile apple`), verified by its signed transaction instead of a
    /// signedPayload. The ingest never sets it: records it writes are always store notifications.
    public static let source = "relay-source"
    /// On raw notification records: `false` makes the worker write no delivery records for the events
    /// (an import that must not reach the webhooks). Absent or anything else: delivered.
    public static let deliver = "relay-deliver"
    /// Request headers copied verbatim into the record when present.
    public static let copiedRequestHeaders = ["stripe-signature", "paddle-signature", "authorization"]
}

/// A store notification as the ingest received it: the body byte for byte plus who sent it and when.
/// Built from any Kafka record that carries the relay headers, whoever produced it.
public struct RawNotification: Sendable {
    public var store: Store
    public var app: String
    /// Receive time, Unix milliseconds. Timestamp tolerances are checked against this, not the worker's clock.
    public var receivedAtMilliseconds: Int64
    public var body: [UInt8]
    /// The signature-carrying request headers (lower-case names).
    public var requestHeaders: [String: String]
    /// `relay-source`: nil for a store notification as received; `appleAPISource` for a record built
    /// from the App Store Server API.
    public var source: String?
    /// `relay-historical: true`: the events are imported history (copied onto the events records).
    public var historical: Bool
    /// `relay-deliver: false` makes this false: the events are produced and recorded, not delivered.
    public var deliver: Bool

    /// The `relay-source` of records synthesized from the App Store Server API.
    public static let appleAPISource = "apple-api"
    /// The `relay-source` of Stripe events `recover stripe` re-ingests: `{"eventId", "type"}`, read again from
    /// Stripe's API by the worker.
    public static let stripeAPISource = "stripe-api"
    /// The `relay-source` of voided purchases `recover google` re-ingests: a DeveloperNotification with a
    /// `voidedPurchaseNotification`, found again in the Voided Purchases API by the worker.
    public static let playAPISource = "play-api"
    /// The `relay-source` of Paddle subscriptions and transactions `reconcile paddle` and `import paddle`
    /// append: `{"objectId", "subject", "reconcile" | "import"}`, read again from Paddle's API by the worker.
    public static let paddleAPISource = "paddle-api"

    public init(
        store: Store, app: String, receivedAtMilliseconds: Int64, body: [UInt8], requestHeaders: [String: String], source: String? = nil,
        historical: Bool = false, deliver: Bool = true
    ) {
        self.store = store
        self.app = app
        self.receivedAtMilliseconds = receivedAtMilliseconds
        self.body = body
        self.requestHeaders = requestHeaders
        self.source = source
        self.historical = historical
        self.deliver = deliver
    }

    /// The Kafka record for this notification: key `{store}:{subject}`, value the body, relay headers.
    /// Pass `subject` when the body was already parsed (`NotificationSubject.extract(store:document:)`).
    public func record(topic: String, subject: String? = nil) -> OutgoingRecord {
        let subject = subject ?? NotificationSubject.extract(store: store, body: body)
        var headers = [
            RecordHeader(name: RelayHeaderName.store, value: store.rawValue),
            RecordHeader(name: RelayHeaderName.app, value: app),
            RecordHeader(name: RelayHeaderName.receivedAt, value: String(receivedAtMilliseconds)),
        ]
        for name in RelayHeaderName.copiedRequestHeaders {
            if let value = requestHeaders[name] {
                headers.append(RecordHeader(name: name, value: value))
            }
        }
        if let source { headers.append(RecordHeader(name: RelayHeaderName.source, value: source)) }
        if historical { headers.append(RecordHeader(name: RelayHeaderName.historical, value: "true")) }
        if !deliver { headers.append(RecordHeader(name: RelayHeaderName.deliver, value: "false")) }
        return OutgoingRecord(topic: topic, key: Array("\(store.rawValue):\(subject)".utf8), value: body, headers: headers)
    }

    /// Why a record is not a raw notification.
    public enum DecodingError: Error, Sendable, Equatable, CustomStringConvertible {
        case missingHeader(String)
        case invalidHeader(String)

        public var description: String {
            switch self {
            case .missingHeader(let name): "record has no \(name) header"
            case .invalidHeader(let name): "record's \(name) header is not valid"
            }
        }
    }

    /// Reads the relay headers of a consumed record.
    public init(record: ConsumedRecord) throws(DecodingError) {
        func text(_ name: String) throws(DecodingError) -> String {
            guard let header = record.headers.first(named: name) else { throw .missingHeader(name) }
            guard let value = header.stringValue else { throw .invalidHeader(name) }
            return value
        }
        guard let store = Store(rawValue: try text(RelayHeaderName.store)) else {
            throw .invalidHeader(RelayHeaderName.store)
        }
        let app = try text(RelayHeaderName.app)
        guard !app.isEmpty else { throw .invalidHeader(RelayHeaderName.app) }
        guard let receivedAt = Int64(try text(RelayHeaderName.receivedAt)) else {
            throw .invalidHeader(RelayHeaderName.receivedAt)
        }
        var requestHeaders: [String: String] = [:]
        for name in RelayHeaderName.copiedRequestHeaders {
            if let value = record.headers.first(named: name)?.stringValue { requestHeaders[name] = value }
        }
        let source = record.headers.first(named: RelayHeaderName.source).map { $0.stringValue ?? "" }
        self.init(
            store: store, app: app, receivedAtMilliseconds: receivedAt, body: record.value, requestHeaders: requestHeaders, source: source,
            historical: record.headers.first(named: RelayHeaderName.historical)?.stringValue == "true",
            deliver: record.headers.first(named: RelayHeaderName.deliver)?.stringValue != "false")
    }
}
