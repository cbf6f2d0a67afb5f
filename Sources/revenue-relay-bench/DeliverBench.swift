import ArgumentParser
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOPosix
import Prometheus
import RelayConfig
import RelayCore
import RelayDelivery
import RelayHTTPClient
import RelayKafka
import ServiceLifecycle
import Synchronization

/// Webhook deliveries per second from `relay.deliveries` (embedded broker) to a keep-alive receiver on
/// loopback, against the same receiver's ceiling measured with `wrk`, and memory per in-flight delivery.
/// Progress on stderr, unbuffered.
func note(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

struct Deliver: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deliver",
        abstract: "Deliveries per second to a loopback receiver vs. its wrk ceiling; memory per in-flight delivery.")

    @Option(help: "Delivery records to send in the throughput run (the embedded broker keeps about 5 MiB per partition).")
    var count = 100_000

    @Option(help: "Partitions of relay.deliveries.")
    var partitions = 32

    @Option(help: "Deliveries held in flight for the memory measurement.")
    var inFlight = 1000

    @Option(help: "wrk connections (and the deliverer's maxInFlightPerEndpoint).")
    var connections = 64

    @Option(help: "Seconds of wrk.")
    var wrkSeconds = 5

    @Option(help: "wrk threads.")
    var wrkThreads = 1

    @Option(help: "Rounds of (wrk ceiling, then deliverer run); the median round is reported.")
    var rounds = 5

    func run() async throws {
        var logger = Logger(label: "bench")
        logger.logLevel = .error
        let body = Self.payload()
        print("payload: \(body.count) bytes, \(count) deliveries, \(partitions) partitions, cores: \(ProcessInfo.processInfo.activeProcessorCount)")

        // 1 and 2, in rounds: the receiver's ceiling under wrk, then the deliverer to the same receiver.
        // A round compares the two measured back to back, so a change in the machine's speed (a shared
        // VM's neighbours) between rounds does not skew its ratio; the median round is the result.
        let receiver = try ReceiverProcess(delayMilliseconds: 0)
        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: logger)
        var results: [(ceiling: Double, rate: Double)] = []
        var cpuPerDelivery: [Double] = []
        for round in 1...max(1, rounds) {
            note("round \(round): receiver on port \(receiver.port); running wrk")
            let ceiling = try wrkCeiling(port: receiver.port, body: body)
            let (rate, cpu) = try await deliveryRate(cluster: cluster, round: round, port: receiver.port, body: body, logger: logger)
            results.append((ceiling, rate))
            cpuPerDelivery.append(cpu)
            print(
                "round \(round): wrk ceiling \(Int(ceiling)) requests/s, deliverer \(Int(rate)) deliveries/s: \(String(format: "%.0f%%", rate / ceiling * 100)); \(String(format: "%.1f", cpu)) µs CPU per delivery"
            )
        }
        let cpu = cpuPerDelivery.sorted()[cpuPerDelivery.count / 2]
        receiver.stop()
        let median = results.sorted { $0.rate / $0.ceiling < $1.rate / $1.ceiling }[results.count / 2]
        let ratios = results.map { $0.rate / $0.ceiling * 100 }
        let ceiling = median.ceiling
        let rate = median.rate
        print("wrk ceiling: \(Int(ceiling)) requests/s (\(connections) connections, \(wrkSeconds) s; the median round)")
        print(
            "deliverer: \(Int(rate)) deliveries/s (\(String(format: "%.0f%%", rate / ceiling * 100)) of the ceiling; rounds from \(String(format: "%.0f%%", ratios.min()!)) to \(String(format: "%.0f%%", ratios.max()!)))"
        )

        // 3. Memory per in-flight delivery, against a receiver that answers after 30 s.
        let slow = try ReceiverProcess(delayMilliseconds: 30_000)
        let perDelivery = try await memoryPerInFlight(cluster: cluster, port: slow.port, body: body, logger: logger)
        slow.stop()
        print("memory per in-flight delivery: \(perDelivery / 1024) KiB (RSS growth with \(inFlight) deliveries in flight / \(inFlight))")
        print("")
        print("| measurement | value |")
        print("| --- | ---: |")
        print("| receiver ceiling (`wrk -t\(wrkThreads) -c\(connections)`, \(body.count)-byte POST) | \(Int(ceiling)) req/s |")
        print("| deliverer, \(count) deliveries from the embedded broker | \(Int(rate)) deliveries/s |")
        print("| deliverer / ceiling (median of \(results.count) rounds) | \(String(format: "%.0f%%", rate / ceiling * 100)) |")
        print("| deliverer / ceiling, lowest and highest round | \(String(format: "%.0f%%", ratios.min()!)) and \(String(format: "%.0f%%", ratios.max()!)) |")
        print("| deliverer CPU per delivery (median round; the in-process broker included) | \(String(format: "%.0f", cpu)) µs |")
        print("| memory per in-flight delivery | \(perDelivery / 1024) KiB |")
    }

    /// A standardized event as the worker produces it: about 1.3 KB.
    static func payload() -> [UInt8] {
        let data: JSON = [
            "id": "stripe:evt_1Pq8xYZ2eZvKYlo2C0FFEE00:renewal", "name": "renewal", "cancelReason": nil, "expirationReason": nil,
            "exchangeRate": 1.0, "isSmallBusiness": false, "periodType": "NORMAL", "countryCode": "US", "price": 9.99, "proceeds": 9.69,
            "priceInPurchasedCurrency": 9.99, "currencyCode": "USD", "taxPercentage": 0, "commissionPercentage": 0.0,
            "takehomePercentage": 1.0, "offerCode": nil, "isFamilyShare": false, "expirationAt": 1_756_659_704_000,
            "transactionId": "in_1Pq8xYZ2eZvKYlo2C0FFEE00", "originalTransactionId": "sub_1Pq8xYZ2eZvKYlo2C0FFEE00",
            "originalAppUserId": "user_0123456789abcdef", "store": "STRIPE", "purchasedAt": 1_754_067_704_000,
            "productId": "price_1Pq8xYZ2eZvKYlo2monthly", "environment": "PRODUCTION", "isTrialConversion": false, "newProductId": nil,
            "bundleId": nil, "ts": 1_754_067_710_106, "sdkEvents": ["transactionComplete"],
            "entitlements": [["id": "pro", "type": "SERVICE_LEVEL"]],
            "subscriptionStatus": ["status": "ACTIVE", "entitlements": [["id": "pro", "type": "SERVICE_LEVEL"]]],
            "gracePeriodExpiresAt": nil,
            "source": ["store": "stripe", "notificationId": "evt_1Pq8xYZ2eZvKYlo2C0FFEE00", "type": "invoice.paid", "subtype": nil],
        ]
        let event: JSON = ["object": "event", "type": "renewal", "projectId": 1, "applicationId": 1, "timestamp": 1_754_067_715_103, "data": data]
        return event.serialized()
    }

    func configuration(port: Int, maxInFlight: Int, perEndpoint: Int) throws -> RelayConfiguration {
        let yaml = """
            apps:
              - { key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_bench"] } }
            endpoints:
              - { id: bench, app: demo, url: "http://127.0.0.1:\(port)/webhooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] }
            delivery: { maxInFlight: \(maxInFlight), maxInFlightPerEndpoint: \(perEndpoint), allowPrivateNetworks: true, timeout: 60s }
            """
        return try RelayConfiguration.parse(yaml: yaml, baseDirectory: FileManager.default.currentDirectoryPath, environment: [:])
    }

    /// Produces `count` delivery records, many sends in flight at once.
    func fill(_ producer: KafkaProducer, topic: String, count: Int, body: [UInt8], prefix: String) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<count {
                if index >= 2000 { try await group.next() }
                group.addTask {
                    _ = try await producer.send(
                        DeliveryRecord.fresh(
                            topic: topic, endpoint: "bench", subject: "\(prefix)\(index)", body: body, eventID: "\(prefix):\(index):renewal",
                            eventType: "renewal", app: "demo"))
                }
            }
            try await group.waitForAll()
        }
    }

    func startDeliverer(_ configuration: RelayConfiguration, cluster: EmbeddedKafkaCluster, logger: Logger) throws -> Task<Void, any Error> {
        let kafka = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)
        // The same metrics backend as a running process (Prometheus), so its cost is in the numbers.
        let metrics = PrometheusMetricsFactory(registry: PrometheusCollectorRegistry())
        let options = Deliverer.consumerOptions(for: configuration)
        var consumerConfiguration = KafkaConsumerConfiguration(groupID: options.groupID + "-" + UUID().uuidString.prefix(6), topics: options.topics)
        consumerConfiguration.maxInFlight = options.maxInFlight
        consumerConfiguration.sessionTimeout = .seconds(6)
        consumerConfiguration.dueTime = options.dueTime
        let consumer = try KafkaConsumer(configuration: kafka, consumer: consumerConfiguration, logger: logger, metrics: metrics)
        let producer = try KafkaProducer(configuration: kafka, logger: logger)
        let deliverer = try Deliverer(configuration: configuration, consumer: consumer, producer: producer, logger: logger, metrics: metrics)
        let task = Task {
            try await deliverer.run()
            await producer.close()
        }
        return task
    }

    /// Deliveries per second, and this process's CPU microseconds per delivery (the embedded broker's included).
    func deliveryRate(
        cluster: EmbeddedKafkaCluster, round: Int, port: Int, body: [UInt8], logger: Logger
    ) async throws -> (perSecond: Double, cpuMicroseconds: Double) {
        var configuration = try configuration(port: port, maxInFlight: 1024, perEndpoint: connections)
        // A topic per round: the embedded broker keeps only so much per partition.
        configuration.topics.deliveries = "relay.deliveries.round-\(round)"
        for topic in configuration.topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
            if topic == configuration.topics.deliveries {
                try cluster.createTopic(topic, partitions: partitions)
            } else if round == 1 {
                try cluster.createTopic(topic, partitions: 2)
            }
        }
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), logger: logger)
        try await fill(producer, topic: configuration.topics.deliveries, count: count, body: body, prefix: "t")
        await producer.close()
        note("produced \(count) delivery records")
        let counter = ReceiverCounter(port: port)
        let before = try await counter.received()
        let task = try startDeliverer(configuration, cluster: cluster, logger: logger)
        // Timed from the first 5% (the consumer group has joined and connections are open) to the last.
        let warm = before + count / 20
        var lastNote = ContinuousClock.now
        while try await counter.received() < warm {
            try await Task.sleep(for: .milliseconds(25))
            if ContinuousClock.now - lastNote > .seconds(2) {
                lastNote = .now
                note("waiting: received \(try await counter.received()) of \(warm)")
            }
        }
        note("timing from \(warm - before) deliveries")
        let start = ContinuousClock.now
        let startCPU = Self.processCPUSeconds()
        let startCount = try await counter.received()
        while try await counter.received() < before + count { try await Task.sleep(for: .milliseconds(25)) }
        let elapsed = ContinuousClock.now - start
        let cpu = Self.processCPUSeconds() - startCPU
        task.cancel()
        _ = try? await task.value
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let delivered = Double(before + count - startCount)
        return (delivered / seconds, cpu / delivered * 1e6)
    }

    /// CPU time (user and system) this process has used, in seconds.
    static func processCPUSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    func memoryPerInFlight(cluster: EmbeddedKafkaCluster, port: Int, body: [UInt8], logger: Logger) async throws -> Int {
        var configuration = try configuration(port: port, maxInFlight: inFlight + 24, perEndpoint: inFlight + 1)
        configuration.topics.deliveries = "relay.deliveries.memory"
        try cluster.createTopic(configuration.topics.deliveries, partitions: 4)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), logger: logger)
        let counter = ReceiverCounter(port: port)
        let task = try startDeliverer(configuration, cluster: cluster, logger: logger)
        // One delivery first: the group has joined, the consumer fetches and the engine runs; then the baseline.
        try await fill(producer, topic: configuration.topics.deliveries, count: 1, body: body, prefix: "warm")
        while try await counter.received() < 1 { try await Task.sleep(for: .milliseconds(10)) }
        try await Task.sleep(for: .milliseconds(300))
        let baseline = Self.residentBytes()
        try await fill(producer, topic: configuration.topics.deliveries, count: inFlight, body: body, prefix: "m")
        await producer.close()
        while try await counter.received() < inFlight + 1 { try await Task.sleep(for: .milliseconds(10)) }
        try await Task.sleep(for: .milliseconds(300))
        let loaded = Self.residentBytes()
        task.cancel()
        return max(0, loaded - baseline) / inFlight
    }

    static func residentBytes() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
        else { return 0 }
        return (Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0) * 1024
    }

    func wrkCeiling(port: Int, body: [UInt8]) throws -> Double {
        let script = FileManager.default.temporaryDirectory.appendingPathComponent("revenue-relay-bench-\(UUID().uuidString).lua")
        let escaped = String(decoding: body, as: UTF8.self).replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
        // The same headers a delivery carries, so the receiver parses the same amount.
        try Data(
            """
            wrk.method = "POST"
            wrk.body = "\(escaped)"
            wrk.headers["Content-Type"] = "application/json"
            wrk.headers["User-Agent"] = "revenue-relay/\(RelayVersion.current)"
            wrk.headers["webhook-id"] = "stripe:evt_1Pq8xYZ2eZvKYlo2C0FFEE00:renewal"
            wrk.headers["webhook-timestamp"] = "1754067715"
            wrk.headers["webhook-signature"] = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
            wrk.headers["svix-id"] = "stripe:evt_1Pq8xYZ2eZvKYlo2C0FFEE00:renewal"
            wrk.headers["svix-timestamp"] = "1754067715"
            wrk.headers["svix-signature"] = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
            """.utf8
        ).write(to: script)
        defer { try? FileManager.default.removeItem(at: script) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["wrk", "-t\(wrkThreads)", "-c\(connections)", "-d\(wrkSeconds)s", "-s", script.path, "http://127.0.0.1:\(port)/webhooks"]
        let output = Pipe()
        process.standardOutput = output
        try process.runWithSignalsUnblocked()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0,
            let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Requests/sec:") }),
            let value = Double(line.split(separator: " ").last ?? "")
        else { throw ValidationError("wrk failed (apt-get install wrk): \(text)") }
        return value
    }
}

/// How many POSTs the receiver process has answered (GET /count).
struct ReceiverCounter {
    let client = HTTPClient(maxConcurrentTransfers: 1)
    let port: Int

    func received() async throws -> Int {
        let response = try await client.send("GET", "http://127.0.0.1:\(port)/count")
        return Int(response.bodyText) ?? 0
    }
}

/// `revenue-relay-bench receiver` in a child process, so the receiver's CPU is its own, as wrk sees it.
final class ReceiverProcess {
    let port: Int
    private let process: Process
    /// The receiver's stdin, held open for its life: it exits when this process does.
    private let input: Pipe

    init(delayMilliseconds: Int) throws {
        (process, input, port) = try startChild(
            ["receiver", "--delay-ms", String(delayMilliseconds), "--exit-when-stdin-closes"], announcing: "port: ", what: "the receiver", log: nil
        ) { line in
            guard let port = Int(line) else { throw ValidationError("the receiver printed port: \(line)") }
            return port
        }
    }

    func stop() {
        process.terminate()
        process.waitUntilExit()
    }
}

/// A minimal keep-alive HTTP/1.1 webhook receiver (Hummingbird): 204 to every POST, the count on GET /count.
struct Receiver: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "receiver", abstract: "The benchmark's receiver (used by `deliver`).")

    @Option(name: .customLong("delay-ms"), help: "Answer POSTs after this long.")
    var delayMilliseconds = 0

    @Option(help: "Event loop threads.")
    var threads = 1

    @Flag(help: .hidden)
    var exitWhenStdinCloses = false

    func run() async throws {
        // Started by a bench (`ReceiverProcess`): gone with it.
        if exitWhenStdinCloses { exitWhenStandardInputCloses() }
        let received = Atomic<Int>(0)
        // Each POST's `webhook-id` and wall-clock arrival (ns), for `e2e`'s latencies: GET /arrivals?from=N.
        let arrivals = Mutex<[(id: String, nanoseconds: Int64)]>([])
        let delay = delayMilliseconds
        let responder = CallbackResponder<BasicRequestContext> { request, _ in
            if request.method == .get {
                if request.uri.path == "/arrivals" {
                    let from = request.uri.queryParameters.get("from", as: Int.self) ?? 0
                    var text = ""
                    arrivals.withLock { list in
                        for arrival in list.dropFirst(from) { text += "\(arrival.id) \(arrival.nanoseconds)\n" }
                    }
                    return Response(status: .ok, body: ResponseBody(byteBuffer: ByteBuffer(string: text)))
                }
                return Response(status: .ok, body: ResponseBody(byteBuffer: ByteBuffer(string: String(received.load(ordering: .relaxed)))))
            }
            _ = try await request.body.collect(upTo: 1 << 20)
            if let id = request.headers.first(where: { $0.name.canonicalName == "webhook-id" })?.value {
                let now = wallClockNanoseconds()
                arrivals.withLock { $0.append((id, now)) }
            }
            received.add(1, ordering: .relaxed)
            if delay > 0 { try await Task.sleep(for: .milliseconds(delay)) }
            return Response(status: .noContent)
        }
        var logger = Logger(label: "receiver")
        logger.logLevel = .critical
        let application = Application(
            responder: responder, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: nil),
            onServerRunning: { channel in
                FileHandle.standardOutput.write(Data("port: \(channel.localAddress?.port ?? 0)\n".utf8))
            }, eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup(numberOfThreads: threads)), logger: logger)
        try await application.runService()
    }
}

/// The HTTP engine alone: POSTs to the receiver with `concurrency` in flight (for profiling the deliverer).
struct EngineBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "engine", abstract: "HTTPTransferEngine alone against the receiver.")

    @Option var count = 20_000
    @Option var concurrency = 64

    func run() async throws {
        let receiver = try ReceiverProcess(delayMilliseconds: 0)
        defer { receiver.stop() }
        let engine = try HTTPTransferEngine()
        let body = Deliver.payload()
        let start = ContinuousClock.now
        let startCPU = Deliver.processCPUSeconds()
        let url = "http://127.0.0.1:\(receiver.port)/webhooks"
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<count {
                if index >= concurrency { await group.next() }
                group.addTask {
                    let result = await engine.send(HTTPTransferRequest(url: url, headers: [("Content-Type", "application/json")], body: body, timeout: .seconds(10)))
                    if result.response?.status != 204 { note("failed: \(String(describing: result.error))") }
                }
            }
        }
        let elapsed = ContinuousClock.now - start
        let cpu = (Deliver.processCPUSeconds() - startCPU) / Double(count) * 1e6
        note(
            "engine: \(count) in \(elapsed): \(Int(Double(count) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))) /s, \(String(format: "%.1f", cpu)) µs CPU per request")
        await engine.close()
    }
}
