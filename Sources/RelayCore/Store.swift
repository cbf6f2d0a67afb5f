/// A store whose server notifications revenue-relay receives.
public enum Store: String, Sendable, CaseIterable, Hashable, Codable {
    case apple
    case google
    case stripe
    case paddle

    /// The request header that carries the store's signature, copied into the raw record (DESIGN section 4).
    public var signatureHeader: String? {
        switch self {
        case .apple: nil
        case .google: "authorization"
        case .stripe: "stripe-signature"
        case .paddle: "paddle-signature"
        }
    }
}
