import RelayCrypto
import ArgumentParser
import Foundation
import RelayConfig
import RelayCore
import RelayVerification

/// Benchmarks (docs/benchmarks.md). Build in release: `swift run -c release revenue-relay-bench <name>`.
@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revenue-relay-bench",
        abstract: "revenue-relay benchmarks (run from the repository root, built with -c release).",
        subcommands: [AppleVerify.self, Deliver.self, Receiver.self, EngineBench.self, LogBench.self, LogCrashChild.self, SQLiteCrashChild.self, E2EBench.self, E2ERelay.self, E2EBroker.self, ABBench.self, CodecBench.self, IngestBench.self]
    )
}

/// Apple notifications, each with a signed transaction and renewal info (three ES256 signatures), on
/// the fixtures' real-shaped chain (P-384 root and intermediate, P-256 leaf), verified on one thread:
/// with the chain cache (steady state) and without it (every JWS builds and checks its chain).
struct AppleVerify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple-verify", abstract: "Apple notification verifications per second on one core, cached and uncached.")

    @Option(help: "Seconds per measurement.")
    var seconds: Double = 5

    @Option(help: "The fixtures directory (Tests/Fixtures).")
    var fixtures = "Tests/Fixtures"

    @Flag(help: "Skip `openssl speed ecdsap256`.")
    var skipOpenSSL = false

    @Flag(help: "Measure only the cached case (for profiling).")
    var cachedOnly = false

    func run() async throws {
        let bodies = try makeNotifications(count: 256)
        var configuration = RelayConfiguration.Apple(
            bundleId: "com.example.app", appAppleId: 1234, environments: ["Sandbox", "Production"],
            rootCertificates: ["\(fixtures)/apple/root.pem"])
        // The leaf key's table is built when its chain is first entered (here at once; in the relay in the background).
        func verifier(_ configuration: RelayConfiguration.Apple, capacity: Int = 64, tables: Bool = true) throws -> AppleVerifier {
            try AppleVerifier(
                app: "bench", configuration: configuration, configurationKey: "apple", chainCacheCapacity: capacity,
                prepareKeys: { key in if tables { key.prepareFixedBaseTable() } })
        }
        let strict = try verifier(configuration)
        let withoutTable = try verifier(configuration, tables: false)
        let uncached = try verifier(configuration, capacity: 0)
        configuration.verifyNestedSignatures = false
        let covered = try verifier(configuration)
        // Every body must verify, or the numbers mean nothing.
        for body in bodies {
            _ = try covered.verify(body: body)
            _ = try strict.verify(body: body)
            _ = try withoutTable.verify(body: body)
        }

        // One ES256 verification through the relay's OpenSSL calls (a digest, then EVP_PKEY_verify), and with the key's table.
        let leafKey = try PrivateKey(pem: String(contentsOfFile: "\(fixtures)/apple/leaf.key", encoding: .utf8))
        let message = Array(repeating: UInt8(ascii: "a"), count: 4096)
        let signature = try leafKey.signES256(message)
        let publicKey = leafKey.publicKey
        let singleRate = measure(seconds: min(seconds, 2)) { _ in _ = publicKey.verifyES256(message, rawSignature: signature) }
        let tabledKey = leafKey.publicKey
        guard tabledKey.prepareFixedBaseTable() else { throw ValidationError("the leaf key's table could not be built") }
        let tabledRate = measure(seconds: min(seconds, 2)) { _ in _ = tabledKey.verifyES256(message, rawSignature: signature) }
        let coveredRate = measure(seconds: seconds) { index in _ = try? covered.verify(body: bodies[index % bodies.count]) }
        let strictRate = measure(seconds: seconds) { index in _ = try? strict.verify(body: bodies[index % bodies.count]) }
        let withoutTableRate = measure(seconds: seconds) { index in _ = try? withoutTable.verify(body: bodies[index % bodies.count]) }
        let uncachedRate = cachedOnly ? 0 : measure(seconds: seconds) { index in _ = try? uncached.verify(body: bodies[index % bodies.count]) }
        let opensslRate = skipOpenSSL ? nil : opensslVerifyRate(seconds: seconds)

        print("Apple notification verification, one thread, \(bodies[0].count)-byte bodies, each a JWS with two nested JWSs")
        print("| measurement | per second per core |")
        print("| --- | ---: |")
        print("| notifications, chain cached (the default: three ES256 signatures each, with the leaf key's table) | \(Int(strictRate)) |")
        print("| the same without the key's table (OpenSSL's own ES256 verification) | \(Int(withoutTableRate)) |")
        print("| notifications, chain cached, `verifyNestedSignatures: false` (one signature each: it covers the nested JWSs) | \(Int(coveredRate)) |")
        print("| one ES256 verification (4 KiB) with the key's table | \(Int(tabledRate)) |")
        print("| one ES256 verification (4 KiB) through OpenSSL's `EVP_PKEY_verify` | \(Int(singleRate)) |")
        print("| notifications, chain built for every JWS | \(Int(uncachedRate)) |")
        if let opensslRate {
            print("| `openssl speed ecdsap256` verify | \(Int(opensslRate)) |")
            print("| the default's rate / a third of that (three signatures each) | \(String(format: "%.0f%%", strictRate / (opensslRate / 3) * 100)) |")
            print("| `verifyNestedSignatures: false` rate / that (one signature each) | \(String(format: "%.0f%%", coveredRate / opensslRate * 100)) |")
        }
    }

    /// Distinct notifications (own ids, transaction ids and dates) on one chain, as a steady stream is.
    func makeNotifications(count: Int) throws -> [[UInt8]] {
        let key = try PrivateKey(pem: String(contentsOfFile: "\(fixtures)/apple/leaf.key", encoding: .utf8))
        let chain = try ["leaf", "intermediate", "root"].map { name in
            Base64.encode(try Certificate.pem(Array(String(contentsOfFile: "\(fixtures)/apple/\(name).pem", encoding: .utf8).utf8))[0].der)
        }
        let header: JSON = ["alg": "ES256", "x5c": .array(chain.map(JSON.string))]
        func sign(_ payload: JSON) throws -> String {
            let input = Base64.encodeURL(header.serialized()) + "." + Base64.encodeURL(payload.serialized())
            return input + "." + Base64.encodeURL(try key.signES256(Array(input.utf8)))
        }
        let date: Int64 = 1_893_456_000_000
        return try (0..<count).map { index in
            let signedDate = date + Int64(index) * 1000
            let transaction: JSON = [
                "transactionId": .string("20000009\(index)"), "originalTransactionId": .string("20000001\(index)"),
                "bundleId": "com.example.app", "productId": "com.example.pro.monthly", "purchaseDate": .integer(signedDate),
                "originalPurchaseDate": .integer(signedDate), "expiresDate": .integer(signedDate + 2_592_000_000),
                "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "environment": "Sandbox",
                "signedDate": .integer(signedDate), "price": 9990, "currency": "USD", "storefront": "USA",
                "transactionReason": "RENEWAL", "appAccountToken": "7e3fb20b-4cdb-47cc-936d-99d65f608138",
            ]
            let renewal: JSON = [
                "originalTransactionId": .string("20000001\(index)"), "autoRenewProductId": "com.example.pro.monthly",
                "productId": "com.example.pro.monthly", "autoRenewStatus": 1, "environment": "Sandbox", "signedDate": .integer(signedDate),
                "renewalDate": .integer(signedDate + 2_592_000_000), "renewalPrice": 9990, "currency": "USD",
            ]
            let payload: JSON = [
                "notificationType": "DID_RENEW", "notificationUUID": .string(UUID().uuidString.lowercased()), "version": "2.0",
                "signedDate": .integer(signedDate),
                "data": [
                    "appAppleId": 1234, "bundleId": "com.example.app", "bundleVersion": "1.0", "environment": "Sandbox", "status": 1,
                    "signedTransactionInfo": .string(try sign(transaction)), "signedRenewalInfo": .string(try sign(renewal)),
                ],
            ]
            return JSON.object(["signedPayload": .string(try sign(payload))]).serialized()
        }
    }
}

/// `openssl speed -seconds N ecdsap256`'s verify/s on one core: V, the machine's ES256 verification rate, which
/// the end-to-end goals are stated against (docs/benchmarks.md).
func opensslVerifyRate(seconds: Double) -> Double? {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["openssl", "speed", "-seconds", "\(max(1, Int(seconds)))", "ecdsap256"]
    let output = Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    // openssl speed times itself with SIGALRM.
    guard (try? process.runWithSignalsUnblocked()) != nil else { return nil }
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    // " 256 bits ecdsa (nistp256)   0.0000s   0.0001s  51902.0  16935.7"
    guard let line = text.split(separator: "\n").first(where: { $0.contains("nistp256") }),
        let last = line.split(separator: " ").last
    else { return nil }
    return Double(last)
}

extension Process {
    /// `run()`, with this thread's signals unblocked for the spawn and the mask put back after: a child
    /// inherits the spawning thread's mask, and Swift's threads block signals, so without this the child
    /// (and its children) would not see SIGALRM, SIGINT or SIGTERM.
    func runWithSignalsUnblocked() throws {
        var empty = sigset_t()
        var previous = sigset_t()
        sigemptyset(&empty)
        pthread_sigmask(SIG_SETMASK, &empty, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        try run()
    }
}

/// Operations per second of `body` on this thread over `seconds` (after a short warm-up).
func measure(seconds: Double, _ body: (Int) -> Void) -> Double {
    for index in 0..<200 { body(index) }
    let clock = ContinuousClock()
    let start = clock.now
    let deadline = start + .milliseconds(Int64(seconds * 1000))
    var count = 0
    while clock.now < deadline {
        for _ in 0..<50 {
            body(count)
            count += 1
        }
    }
    let elapsed = clock.now - start
    return Double(count) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}
