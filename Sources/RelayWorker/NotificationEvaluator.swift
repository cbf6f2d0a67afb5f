public import RelayCore
public import RelayNormalization
public import RelayVerification

/// Verify, then normalize: what one raw notification becomes, with nothing written anywhere. The
/// worker's `NotificationHandler` and `revenue-relay inspect` both run it, so what `inspect` answers is what the
/// worker does.
public struct NotificationEvaluator: Sendable {
    /// What a notification became.
    public enum Outcome: Sendable {
        /// Authentic, and these standardized events (none for a type no table maps).
        case accepted(VerifiedNotification, events: [StandardEvent])
        /// Refused with a reason: by verification (`verified` nil), or by normalization after the
        /// notification was verified (a Google purchase the Play Developer API does not know).
        case rejected(Rejection, verified: VerifiedNotification?)
    }

    /// A dependency (Google's keys, the backend, a store API) could not be reached: try again later.
    public struct Unavailable: Error, Sendable, CustomStringConvertible {
        public var message: String
        public var description: String { "unavailable: \(message)" }
    }

    private let verifier: NotificationVerifier
    private let normalizer: SubscriptionUpdater

    public init(verifier: NotificationVerifier, normalizer: SubscriptionUpdater) {
        self.verifier = verifier
        self.normalizer = normalizer
    }

    public func evaluate(_ notification: RawNotification) async throws(Unavailable) -> Outcome {
        let verdict: Verdict
        do {
            verdict = try await verifier.verify(notification)
        } catch {
            throw Unavailable(message: error.message)
        }
        switch verdict {
        case .rejected(let rejection):
            return .rejected(rejection, verified: nil)
        case .accepted(let verified):
            do {
                return .accepted(verified, events: try await normalizer.normalize(verified, receivedAt: notification.receivedAtMilliseconds))
            } catch {
                switch error {
                case .rejected(let rejection): return .rejected(rejection, verified: verified)
                case .unavailable(let message): throw Unavailable(message: message)
                }
            }
        }
    }
}
