/// This build's version: `revenue-relay --version`, and the webhook `User-Agent` (`revenue-relay/<version>`).
public enum RelayVersion {
    public static let current = "0.1.0"
}
