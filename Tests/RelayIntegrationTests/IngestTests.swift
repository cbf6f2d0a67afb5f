import Foundation
import Glibc
import RelayApp
import RelayCore
import RelayHTTPClient
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// Signature headers of the right shape (the ingest refuses requests without them; the worker verifies them).
let stripeSigned = [("Stripe-Signature", "t=1700000000,v1=00")]
let paddleSigned = [("Paddle-Signature", "ts=1700000000;h1=00")]

func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// The ingest contract (docs/contracts.md (ingest and the raw record)) over real HTTP and the embedded broker.
@Suite struct IngestTests {
    @Test func answers503WhileEveryBrokerIsDownAnd200AfterTheyReturn() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration(ackTimeout: "1500ms"))
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: #"{"id":"evt_before"}"#, headers: stripeSigned).status == 200)
        try await waitUntil("ready") { try await relay.get("/health/ready").status == 200 }

        try #require(relay.environment.cluster).takeDown()
        let during = try await relay.post("/v1/notifications/stripe/demo", body: #"{"id":"evt_during"}"#, headers: stripeSigned)
        #expect(during.status == 503)
        try await waitUntil("not ready while Kafka is unreachable") { try await relay.get("/health/ready").status == 503 }
        #expect(try await relay.get("/health/live").status == 200)

        try #require(relay.environment.cluster).bringUp()
        // The store retries; once the producer has reconnected, the retry is accepted.
        try await waitUntil("a 200 after the brokers returned") {
            try await relay.post("/v1/notifications/stripe/demo", body: #"{"id":"evt_after"}"#, headers: stripeSigned).status == 200
        }
        try await waitUntil("ready again") { try await relay.get("/health/ready").status == 200 }
        try await relay.stop()
    }

    @Test func gracefulShutdownLeavesNoAcceptedRequestUnwritten() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        let accepted = LockedBox<[String]>([])
        let answered = LockedBox<Int>(0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<60 {
                group.addTask {
                    let id = "evt_\(index)"
                    // Requests after the server stopped fail to connect or get 503: the store retries those.
                    let response = try? await relay.post("/v1/notifications/stripe/demo", body: #"{"id":"\#(id)"}"#, headers: stripeSigned)
                    if response?.status == 200 { accepted.withLock { $0.append("stripe:\(id)") } }
                    answered.withLock { $0 += 1 }
                }
            }
            group.addTask {
                try await waitUntil("some requests answered") { answered.value >= 10 }
                await relay.environment.process.triggerGracefulShutdown()
            }
            try await group.waitForAll()
        }
        try await relay.runTask.value
        let acceptedKeys = Set(accepted.value)
        #expect(acceptedKeys.count >= 10)

        // The broker outlives the process in this test: read what the ingest wrote.
        let (reader, collector) = try relay.notificationsReader()
        let records = try await collector.waitFor(count: acceptedKeys.count)
        #expect(acceptedKeys.isSubset(of: Set(records.compactMap(\.keyString))))
        await reader.close()
    }

    @Test func operationalRoutesAnswer() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        #expect(try await relay.get("/health/live").status == 200)
        try await waitUntil("ready") { try await relay.get("/health/ready").status == 200 }
        #expect(try await relay.post("/v1/notifications/paddle/demo", body: #"{"event_id":"evt_m"}"#, headers: paddleSigned).status == 200)
        #expect(try await relay.post("/v1/notifications/paddle/demo", body: #"{"event_id":"evt_n"}"#, headers: paddleSigned).status == 200)
        let metrics = try await relay.get("/metrics")
        #expect(metrics.status == 200)
        #expect(metrics.header("content-type")?.hasPrefix("text/plain") == true)
        #expect(metrics.bodyText.contains(#"relay_ingest_requests_total{store="paddle",status="200"} 2"#))
        #expect(metrics.bodyText.contains(#"relay_kafka_produced_total{topic="relay.notifications",outcome="acknowledged"} 2"#))
        try await relay.stop()
    }

    @Test func metricsListenKeepsMetricsOffThePublicPort() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration(extra: #"metrics: { listen: "127.0.0.1:0" }"#))
        #expect(try await relay.post("/v1/notifications/paddle/demo", body: #"{"event_id":"evt_p"}"#, headers: paddleSigned).status == 200)
        // The public port serves the ingest and health, not /metrics.
        #expect(try await relay.get("/metrics").status == 404)
        #expect(try await relay.get("/health/live").status == 200)
        let metricsPort = await relay.environment.process.waitForMetricsPort()
        let metrics = try await relay.http.send("GET", "http://127.0.0.1:\(metricsPort)/metrics")
        #expect(metrics.status == 200)
        #expect(metrics.bodyText.contains(#"relay_ingest_requests_total{store="paddle",status="200"} 1"#))
        #expect(try await relay.http.send("GET", "http://127.0.0.1:\(metricsPort)/health/ready").status != 404)
        // The notification routes are not on the metrics port.
        #expect(try await relay.http.send("POST", "http://127.0.0.1:\(metricsPort)/v1/notifications/paddle/demo", body: Array("{}".utf8)).status == 404)
        try await relay.stop()
    }
}
