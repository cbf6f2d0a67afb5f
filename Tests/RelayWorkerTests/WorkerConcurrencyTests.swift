import CoreMetrics
import Foundation
import RelayBackend
import RelayConfig
import RelayCore
import RelayEmbeddedLog
import RelayNormalization
import RelayTestSupport
import RelayVerification
import RelayWorker
import ServiceLifecycle
import Synchronization
import Testing

/// The worker runs different subscriptions' notifications concurrently and one subscription's in order.
@Suite struct WorkerConcurrencyTests {
    /// App `demo` taking Stripe events signed with `whsec_test`, `price_pro` unlocking `pro`.
    static func configuration() throws -> RelayConfiguration {
        try RelayConfiguration.parse(
            yaml: """
                apps:
                  - key: demo
                    projectId: 1
                    applicationId: 1
                    stripe: { signingSecrets: ["whsec_test"] }
                    products: [{ productId: price_pro, store: STRIPE, entitlements: [pro] }]
                """, baseDirectory: "/", environment: [:])
    }

    /// Holds the record whose value is `blocked` until released; records every start and finish.
    final class GatedProcessor: WorkerRecordHandler {
        let blocked: String
        let started = LockedBox<[String]>([])
        let finished = LockedBox<[String]>([])
        private let gate = LockedBox<CheckedContinuation<Void, Never>?>(nil)
        private let released = LockedBox(false)

        init(blocking value: String) { blocked = value }

        func process(_ record: ConsumedRecord) async throws {
            let value = text(record.value)
            started.withLock { $0.append(value) }
            if value == blocked {
                await withCheckedContinuation { continuation in
                    let resumeNow = released.withLock { released -> Bool in
                        if !released { gate.withLock { $0 = continuation } }
                        return released
                    }
                    if resumeNow { continuation.resume() }
                }
            }
            finished.withLock { $0.append(value) }
        }

        func release() {
            released.withLock { $0 = true }
            gate.withLock { gate in
                defer { gate = nil }
                return gate
            }?.resume()
        }
    }

    @Test func aSlowRecordHoldsBackItsOwnSubscriptionOnlyEvenWithinOnePartition() async throws {
        let topic = uniqueName("notifications")
        let log = try EmbeddedRecordLog.inMemory(topics: [topic], partitions: 1, logger: testLogger())
        let producer = try log.producer
        // One partition: before, every record waited for the one ahead of it.
        for (key, value) in [("apple:A", "a1"), ("apple:B", "b1"), ("apple:A", "a2"), ("apple:C", "c1"), ("apple:B", "b2")] {
            _ = try await producer.produce(OutgoingRecord(topic: topic, key: Array(key.utf8), value: Array(value.utf8)))
        }
        let group = uniqueName("worker")
        let processor = GatedProcessor(blocking: "a1")
        let worker = WorkerService(
            consumer: try log.consumer(ConsumerOptions(groupID: group, topics: [topic])), handler: processor, logger: testLogger(),
            metrics: NOOPMetricsHandler.instance)
        let serviceGroup = ServiceGroup(configuration: .init(services: [worker], logger: testLogger()))
        let running = Task { try await serviceGroup.run() }

        // a1 is stuck: B's and C's records pass it, in their own order; a2 waits behind a1.
        try await waitUntil("the other subscriptions' records are done") { Set(processor.finished.value) == ["b1", "b2", "c1"] }
        #expect(processor.finished.value.firstIndex(of: "b1")! < processor.finished.value.firstIndex(of: "b2")!)
        #expect(!processor.started.value.contains("a2"))
        // Nothing is stored past a1 while it is not done: a restart now would redeliver it and all after it.
        #expect((try log.committedOffsets(group: group, topic: topic)[0] ?? 0) == 0)

        processor.release()
        try await waitUntil("a2 ran after a1") { processor.finished.value.contains("a2") }
        let finished = processor.finished.value
        #expect(finished.firstIndex(of: "a1")! < finished.firstIndex(of: "a2")!)
        #expect(processor.started.value.filter { $0.hasPrefix("a") } == ["a1", "a2"])
        await serviceGroup.triggerGracefulShutdown()
        try await running.value

        // Every record finished and its offset was stored in order: the group goes on after the last one.
        #expect(try log.committedOffsets(group: group, topic: topic)[0] == 5)
        await log.close()
    }

    /// Fails `failing` every time; records what started.
    final class FailingProcessor: WorkerRecordHandler {
        let failing: String
        let started = LockedBox<[String]>([])
        init(failing: String) { self.failing = failing }

        func process(_ record: ConsumedRecord) async throws {
            let value = text(record.value)
            started.withLock { $0.append(value) }
            if value == failing { throw RecordLogError(code: .timedOut, reason: "test failure", isRetriable: true) }
        }
    }

    @Test func aCancelledLaneRunsNothingBehindItsUnfinishedRecord() async throws {
        let topic = uniqueName("notifications")
        let log = try EmbeddedRecordLog.inMemory(topics: [topic], partitions: 1, logger: testLogger())
        let producer = try log.producer
        for (key, value) in [("apple:A", "a1"), ("apple:A", "a2"), ("apple:B", "b1")] {
            _ = try await producer.produce(OutgoingRecord(topic: topic, key: Array(key.utf8), value: Array(value.utf8)))
        }
        let processor = FailingProcessor(failing: "a1")
        let worker = WorkerService(
            consumer: try log.consumer(ConsumerOptions(groupID: uniqueName("worker"), topics: [topic])), handler: processor,
            logger: testLogger(), metrics: NOOPMetricsHandler.instance, retryBackoff: (.milliseconds(5), .milliseconds(10)))
        let running = Task { try await worker.run() }
        try await waitUntil("a1 is being retried and b1 ran") {
            processor.started.value.filter { $0 == "a1" }.count >= 3 && processor.started.value.contains("b1")
        }
        // Shutdown past its bound cancels the work: a1 is not done, so a2 must not run after it (it would
        // be applied before a1 when both are redelivered).
        running.cancel()
        _ = try? await running.value
        #expect(!processor.started.value.contains("a2"))
        await log.close()
    }

    /// Subscription state in memory with the backend's rules (If-Match on the version, never back in
    /// source time). `conflictOnFirstWrite`: each subscription's first write meets a concurrent writer
    /// (412), as two workers racing on one subscription would.
    final class MemoryStateStore: SubscriptionStateStore {
        let states = LockedBox<[String: SubscriptionState]>([:])
        let conflicts = LockedBox<Set<String>>([])
        let conflictOnFirstWrite: Bool
        let mapping: ProductMapping

        init(conflictOnFirstWrite: Bool, products: [ProductMapping.Product]) {
            self.conflictOnFirstWrite = conflictOnFirstWrite
            mapping = ProductMapping(products: products)
        }

        func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping { mapping }

        func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
            states.value["\(store.rawValue)/\(originalTransactionId)"]
        }

        func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
            let key = "\(state.store.rawValue)/\(state.originalTransactionId)"
            if conflictOnFirstWrite, conflicts.withLock({ $0.insert(key).inserted }) {
                // Another writer got there first: the version moved on under this one.
                states.withLock { states in
                    if var current = states[key] {
                        current.version += 1
                        states[key] = current
                    }
                }
                return .versionMismatch
            }
            return states.withLock { states -> StateWriteResult in
                let current = states[key]
                guard (current?.version ?? 0) == ifMatch else { return .versionMismatch }
                if let current, state.sourceTimestamp < current.sourceTimestamp { return .stale(current: current) }
                var stored = state
                stored.version = ifMatch + 1
                states[key] = stored
                return .written(stored)
            }
        }

        func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
            async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
        { (AppUser(appUserId: id), []) }
    }

    /// Stripe notifications for `subscriptions` subscriptions, each created then renewed (two records of
    /// one key, which must stay in order), signed like Stripe's.
    static func notifications(topic: String, subscriptions: Int, now: Int64) -> [OutgoingRecord] {
        var records: [OutgoingRecord] = []
        for step in 0..<2 {
            for index in 0..<subscriptions {
                let subscription: JSON = [
                    "id": .string("sub_c\(index)"), "object": "subscription", "customer": "cus_1", "status": "active",
                    "start_date": .integer(now - 100), "current_period_end": .integer(now + 2_592_000 * Int64(step + 1)),
                    "cancel_at_period_end": false, "livemode": false, "metadata": ["app_user_id": .string("user-c\(index)")],
                    "items": ["data": [["quantity": 1, "price": ["id": "price_pro", "product": "prod_pro", "unit_amount": 999, "currency": "usd"]]]],
                ]
                let object: JSON =
                    step == 0
                    ? subscription
                    : [
                        "id": .string("in_c\(index)"), "object": "invoice", "subscription": .string("sub_c\(index)"), "billing_reason": "subscription_cycle",
                        "amount_paid": 999, "currency": "usd", "status": "paid", "customer": "cus_1",
                        "lines": ["data": [["price": ["id": "price_pro", "product": "prod_pro"], "period": ["start": .integer(now + 2_592_000), "end": .integer(now + 5_184_000)]]]],
                        "subscription_details": ["metadata": ["app_user_id": .string("user-c\(index)")]],
                    ]
                let event: JSON = [
                    "id": .string("evt_c\(index)_\(step)"), "object": "event", "type": .string(step == 0 ? "customer.subscription.created" : "invoice.paid"),
                    "created": .integer(now + Int64(step)), "livemode": false, "data": ["object": object],
                ]
                let body = Array(event.text.utf8)
                let raw = RawNotification(
                    store: .stripe, app: "demo", receivedAtMilliseconds: now * 1000, body: body,
                    requestHeaders: ["stripe-signature": WebhookSigning.stripeHeader(body: body, secret: "whsec_test", timestamp: now)])
                records.append(raw.record(topic: topic))
            }
        }
        return records
    }

    static let products = [ProductMapping.Product(productId: "price_pro", store: "STRIPE", entitlements: ["pro"])]

    /// An in-memory log with the pipeline's topics (the notifications topic named for this test) holding
    /// `notifications(subscriptions:)`, its producer, and the configuration naming them.
    static func logWithNotifications(
        subscriptions: Int, partitions: Int
    ) async throws -> (RelayConfiguration, EmbeddedRecordLog, any RecordProducer) {
        var configuration = try Self.configuration()
        configuration.topics.notifications = uniqueName("notifications")
        let topics = [configuration.topics.notifications, configuration.topics.events, configuration.topics.deliveries, configuration.topics.rejected]
        let log = try EmbeddedRecordLog.inMemory(topics: topics, partitions: partitions, logger: testLogger())
        let producer = try log.producer
        for record in Self.notifications(topic: configuration.topics.notifications, subscriptions: subscriptions, now: Int64(Date().timeIntervalSince1970)) {
            _ = try await producer.produce(record)
        }
        return (configuration, log, producer)
    }

    /// The worker's pipeline over `store`, producing to `producer`, with no store APIs; logging to `recorder`.
    static func pipeline(
        _ configuration: RelayConfiguration, store: MemoryStateStore, producer: any RecordProducer, recorder: LogRecorder? = nil
    ) throws -> NotificationHandler {
        NotificationHandler(
            configuration: configuration, verifier: try NotificationVerifier(configuration: configuration, logger: testLogger()),
            normalizer: try SubscriptionUpdater(configuration: configuration, stateStore: store, storeAPIs: StoreAPIs(), logger: testLogger(), metrics: NOOPMetricsHandler.instance),
            producer: producer, logger: recorder?.logger ?? testLogger(), metrics: NOOPMetricsHandler.instance)
    }

    /// A notification processed is one debug line (what it was, the events it made, its place in the log),
    /// not an info line: at the default level a relay taking thousands a second logs nothing per notification.
    @Test func aProcessedNotificationIsLoggedAtDebugNotAtInfo() async throws {
        let (configuration, log, producer) = try await Self.logWithNotifications(subscriptions: 2, partitions: 1)
        let recorder = LogRecorder()
        let pipeline = try Self.pipeline(
            configuration, store: MemoryStateStore(conflictOnFirstWrite: false, products: Self.products), producer: producer, recorder: recorder)
        let reader = try log.consumer(ConsumerOptions(groupID: uniqueName("reader"), topics: [configuration.topics.notifications]))
        for record in try await RecordCollector(reader.records).waitFor(count: 4) { try await pipeline.process(record) }
        let lines = recorder.text.split(separator: "\n")
        #expect(lines.filter { $0.hasPrefix("debug notification normalized") && $0.contains("log.offset") }.count == 4, "\(lines)")
        #expect(!lines.contains { $0.hasPrefix("info") || $0.hasPrefix("notice") }, "\(lines)")
        await reader.close()
        await log.close()
    }

    @Test func aCrashAfterProducingRepeatsEveryRecordWithTheSameEventsAndConflictsAreRetriedUnderConcurrency() async throws {
        let subscriptions = 12
        let (configuration, log, producer) = try await Self.logWithNotifications(subscriptions: subscriptions, partitions: 2)
        let store = MemoryStateStore(conflictOnFirstWrite: true, products: Self.products)
        let pipeline = try Self.pipeline(configuration, store: store, producer: producer)
        let group = uniqueName("worker")
        let eventsReader = try log.consumer(ConsumerOptions(groupID: uniqueName("events"), topics: [configuration.topics.events]))
        let collector = RecordCollector(eventsReader.records)

        // 1. Every record is processed, concurrently, and the worker dies before storing any offset.
        func runWorker(_ consumer: any RecordConsumer, until done: @escaping @Sendable () -> Bool) async throws {
            let worker = WorkerService(consumer: consumer, handler: pipeline, logger: testLogger(), metrics: NOOPMetricsHandler.instance,
                                       retryBackoff: (.milliseconds(5), .milliseconds(20)))
            let serviceGroup = ServiceGroup(configuration: .init(services: [worker], logger: testLogger()))
            let running = Task { try await serviceGroup.run() }
            try await waitUntil("the worker produced its events", done)
            await serviceGroup.triggerGracefulShutdown()
            try await running.value
        }
        // Three events per subscription: the purchase and its status change, then the renewal.
        let first = try await {
            try await runWorker(ForgetfulConsumer(try log.consumer(ConsumerOptions(groupID: group, topics: [configuration.topics.notifications])))) {
                collector.count >= subscriptions * 3
            }
            return try await collector.waitFor(count: subscriptions * 3)
        }()
        #expect(try log.committedOffsets(group: group, topic: configuration.topics.notifications).isEmpty)
        // Each subscription met a 412 on its first write, read again and re-applied: both notifications counted.
        #expect(store.conflicts.value.count == subscriptions)
        for index in 0..<subscriptions {
            // Created, then renewed: two writes that counted (the refused first attempt did not).
            #expect(store.states.value["stripe/sub_c\(index)"]?.version == 2)
        }
        // Per subscription, the purchase comes before the renewal (one key's records never reorder).
        for index in 0..<subscriptions {
            let types = first.compactMap { record -> String? in
                guard record.keyString == "sub_c\(index)" else { return nil }
                return record.headers.first(named: "relay-event-type")?.stringValue
            }
            #expect(types == ["initial_purchase", "subscription_status_did_change", "renewal"], "sub_c\(index): \(types)")
        }

        // 2. Restarted, the group reads every record again; the repeats yield the same events, byte for byte.
        try await runWorker(try log.consumer(ConsumerOptions(groupID: group, topics: [configuration.topics.notifications]))) {
            collector.count >= subscriptions * 6
        }
        let all = try await collector.waitFor(count: subscriptions * 6)
        let firstIds = first.compactMap { $0.headers.first(named: "relay-event-id")?.stringValue }
        let repeatIds = all.dropFirst(first.count).compactMap { $0.headers.first(named: "relay-event-id")?.stringValue }
        #expect(Set(firstIds).count == subscriptions * 3)
        #expect(Set(repeatIds) == Set(firstIds))
        let firstValues = Dictionary(uniqueKeysWithValues: first.map { ($0.headers.first(named: "relay-event-id")!.stringValue!, $0.value) })
        for record in all.dropFirst(first.count) {
            #expect(record.value == firstValues[record.headers.first(named: "relay-event-id")!.stringValue!])
        }
        // This time the offsets were stored: both notifications of every subscription are done.
        let committed = try log.committedOffsets(group: group, topic: configuration.topics.notifications)
        #expect(committed.values.reduce(0, +) == Int64(subscriptions * 2))
        await eventsReader.close()
        await log.close()
    }
}
