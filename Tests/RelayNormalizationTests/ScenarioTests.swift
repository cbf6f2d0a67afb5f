import Foundation
import RelayBackend
import RelayCore
import RelayNormalization
import RelayTestSupport
import RelayVerification
import Testing

/// Runs every scenario file through the real verifier, normalizer and local backend. Adding a case is
/// adding a file under `Scenarios/`.
@Suite struct ScenarioTests {
    @Test(arguments: Scenario.all)
    func scenario(_ scenario: Scenario) async throws {
        let document = scenario.document
        let store = try #require(document["store"]?.stringValue.flatMap(Store.init(rawValue:)), "\(scenario.file): \"store\" is missing")
        let templates = document["templates"]?.objectValue ?? [:]
        let steps = try #require(document["steps"]?.arrayValue, "\(scenario.file): \"steps\" is missing")
        // Every scenario in process, with no HTTP; a few also end to end over HTTP (the local backend's
        // routes, the real API clients against fakes on 127.0.0.1): both must give the same answers.
        let transports: [ScenarioHarness.Transport] = Scenario.endToEnd.contains(scenario.file) ? [.inProcess, .http] : [.inProcess]
        for transport in transports {
            let harness = try await ScenarioHarness(stripeAPI: document["stripeApi"]?.boolValue ?? true, transport: transport)
            do {
                try await run(scenario, store: store, templates: templates, steps: steps, harness: harness)
            } catch {
                await harness.stop()
                throw error
            }
            await harness.stop()
        }
    }

    private func run(_ scenario: Scenario, store: Store, templates: [String: JSON], steps: [JSON], harness: ScenarioHarness) async throws {
        let document = scenario.document

        var sent: [(notification: JSON, messageId: String?, receivedAt: Int64, play: JSON, stripe: JSON)] = []
        var produced: [[StandardEvent]] = []
        for (index, step) in steps.enumerated() {
            let label = "\(scenario.file) step \(index)"
            var notification = resolveTemplates(step["notification"] ?? .null, templates)
            var messageId = step["messageId"]?.stringValue
            var play = resolveTemplates(step["play"] ?? .null, templates)
            var stripe = resolveTemplates(step["stripe"] ?? .null, templates)
            var receivedAt = step["receivedAt"]?.int64Value ?? ScenarioHarness.eventTime(store: store, notification).map { $0 + 1000 } ?? Fixtures.signedDate
            if let resend = step["resend"]?.int64Value.map(Int.init) {
                let original = try #require(sent.indices.contains(resend) ? sent[resend] : nil, "\(label): resend of an unknown step")
                (notification, messageId, receivedAt) = (original.notification, original.messageId, original.receivedAt)
                if play.isNull { play = original.play }
                if stripe.isNull { stripe = original.stripe }
            }
            sent.append((notification, messageId, receivedAt, play, stripe))
            harness.now.withLock { $0 = receivedAt }
            harness.play.withLock { $0 = play }
            harness.stripe.withLock { $0 = stripe }

            let raw = harness.request(store: store, notification: notification, messageId: messageId, receivedAt: receivedAt)
            let verdict = try await harness.verifier.verify(raw)
            guard case .accepted(let verified) = verdict else {
                Issue.record("\(label): verification rejected the notification: \(verdict)")
                return
            }
            var events: [StandardEvent] = []
            do {
                events = try await harness.normalizer.normalize(verified, receivedAt: receivedAt)
                if let reason = step["rejected"]?.stringValue { Issue.record("\(label): expected a \(reason) reject, got events") }
            } catch {
                guard case .rejected(let rejection) = error, rejection.reason.rawValue == step["rejected"]?.stringValue else {
                    Issue.record("\(label): normalization failed: \(error)")
                    return
                }
            }
            produced.append(events)

            if let expected = step["expect"]?.arrayValue {
                // What receivers get: the encoded bytes, read back.
                let payloads = try events.map { try JSON.parse($0.body) }
                if payloads.count != expected.count {
                    Issue.record("\(label): expected \(expected.count) events \(expected.map { $0["type"]?.text ?? "?" }), got \(events.map(\.type.rawValue))")
                } else {
                    for (offset, pattern) in expected.enumerated() {
                        for problem in mismatches(pattern, payloads[offset], path: "event[\(offset)]") { Issue.record("\(label): \(problem)") }
                    }
                }
            }
            if let same = step["sameEventsAs"]?.int64Value.map(Int.init) {
                let earlier = try #require(produced.indices.contains(same) ? produced[same] : nil)
                #expect(events.map(\.body) == earlier.map(\.body), "\(label): not the same events as step \(same)")
            }
            for event in events {
                // Invariants of every event: the id names its type, and it carries what receivers key on.
                #expect(event.id.hasSuffix(":\(event.type.rawValue)"), "\(label): id \(event.id)")
                #expect(event.payload.data.id == event.id)
                #expect(event.payload.object == "event")
                #expect(["PRODUCTION", "SANDBOX"].contains(event.environment))
            }
            #expect(Set(events.map(\.id)).count == events.count, "\(label): duplicate event ids \(events.map(\.id))")

            if let pattern = step["state"] {
                let subject = try #require(pattern["originalTransactionId"]?.stringValue ?? document["subject"]?.stringValue, "\(label): state needs a subject")
                let stored = try await harness.subscription(store: store, originalTransactionId: subject)
                for problem in mismatches(pattern, stored?.json, path: "state") { Issue.record("\(label): \(problem)") }
            }
            if let expected = step["entitlements"]?.arrayValue {
                let user = try #require(document["user"]?.stringValue, "\(label): entitlements need the scenario's \"user\"")
                let active = try await harness.activeEntitlements(appUserId: user)
                #expect(active == expected.compactMap(\.stringValue).sorted(), "\(label): the user's entitlements")
            }
        }
    }
}
