import ArgumentParser
import Foundation
import RelayCore
import RelayIngest

/// What the ingest does with each Apple notification before it is written to the log, none of it
/// verification: read the client's address, parse the body, check its shape, and read the subject (the
/// record's key) from the unverified payload and its nested transaction.
struct IngestBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ingest", abstract: "Microseconds per step of the ingest's checks of an Apple notification (address, parse, shape, subject).")

    @Option(help: "Seconds per measurement.")
    var seconds: Double = 2

    @Option(help: "The fixtures directory (Tests/Fixtures).")
    var fixtures = "Tests/Fixtures"

    func run() async throws {
        let factory = try NotificationFactory(fixtures: URL(fileURLWithPath: fixtures).standardizedFileURL.path, mixed: false)
        let bodies = (0..<64).map { factory.make(index: $0, kind: 0).body }
        let documents = try bodies.map { try JSON.parse($0) }
        let noHeader: (String) -> String? = { _ in nil }
        let resolver = ClientAddressResolver(trustedProxies: [])
        // The outer JWS's payload segment, the largest base64url text the ingest and the verifier decode.
        let payloadSegments: [[UInt8]] = documents.map { document in
            let parts = (document["signedPayload"]?.stringValue ?? "").split(separator: ".")
            return parts.count == 3 ? Array(parts[1].utf8) : []
        }
        let rows: [(String, Double)] = [
            ("client address: ClientAddressResolver.client, clientKey", measure(seconds: seconds) { index in
                _ = resolver.client(peer: index % 2 == 0 ? "127.0.0.1" : "2001:db8::7", forwardedFor: [])?.clientKey
            }),
            ("base64url: Base64.decode of the JWS's payload (\(payloadSegments[0].count) B)", measure(seconds: seconds) { index in
                _ = Base64.decode(payloadSegments[index % payloadSegments.count], alphabet: .url, padding: .forbidden, canonical: true)
            }),
            ("body parse: JSON.parse (\(bodies[0].count) B)", measure(seconds: seconds) { index in _ = try? JSON.parse(bodies[index % bodies.count]) }),
            ("shape: NotificationShape.mismatch", measure(seconds: seconds) { index in
                _ = NotificationShape.mismatch(store: .apple, document: documents[index % documents.count], header: noHeader)
            }),
            ("subject: NotificationSubject.extract", measure(seconds: seconds) { index in
                _ = NotificationSubject.extract(store: .apple, document: documents[index % documents.count])
            }),
            ("all three", measure(seconds: seconds) { index in
                let document = try? JSON.parse(bodies[index % bodies.count])
                _ = NotificationShape.mismatch(store: .apple, document: document ?? .null, header: noHeader)
                _ = NotificationSubject.extract(store: .apple, document: document)
            }),
        ]
        print("| step | µs each |")
        print("| --- | ---: |")
        for (name, rate) in rows { print("| \(name) | \(String(format: "%.1f", 1_000_000 / rate)) |") }
    }
}
