/// A store whose server notifications revenue-relay receives.
public enum Store: String, Sendable, CaseIterable, Hashable, Codable {
    case apple
    case google
    case stripe
    case paddle
}
