import Foundation
import Logging
import RelayConfig
import RelayCore
import RelayTestSupport
import RelayVerification
import Testing

/// Verifies one request against the fixtures' configuration.
func verdict(
    _ store: Store, _ body: [UInt8], headers: [String: String] = [:], receivedAt: Int64 = Fixtures.signedDate / 1000, app: String = "demo",
    verifier: NotificationVerifier? = nil
) async throws -> Verdict {
    let verifier = try verifier ?? NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
    let notification = RawNotification(store: store, app: app, receivedAtMilliseconds: receivedAt * 1000, body: body, requestHeaders: headers)
    return try await verifier.verify(notification)
}

/// The reason a verdict rejected with, or nil when it accepted.
func reason(_ verdict: Verdict) -> RejectReason? { verdict.rejection?.reason }
