import Foundation
public import RelayConfig

/// The configuration of the suites that run a whole relay for an Apple app: app `demo` takes Apple data
/// signed by the test root (Tests/Fixtures/apple), and `com.example.pro.monthly` unlocks `pro`.
public enum AppleRelayConfiguration {
    /// The YAML. `apple` are more members of the app's `apple` section (`key: value`, one a line);
    /// `sections` more top-level sections, written as they are.
    /// `app` are more members of the app itself (`transferPolicy: keep`), one a line.
    public static func text(environments: String = "[Sandbox]", apple: [String] = [], app: [String] = [], sections: String = "") -> String {
        let more = apple.map { "\n      \($0)" }.joined()
        let appMembers = app.map { "\n    \($0)" }.joined()
        return """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1\(appMembers)
                apple:
                  bundleId: com.example.app
                  appAppleId: 1234
                  environments: \(environments)
                  rootCertificates: ["\(Fixtures.path("apple/root.pem"))"]\(more)
                products:
                  - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
            \(sections)delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
    }

    /// The `serverApi` member that points the app at `fake`.
    public static func serverApi(_ fake: FakeAppStore) -> String {
        #"serverApi: { keyId: \#(FakeAppStore.keyId), issuerId: "\#(FakeAppStore.issuerId)", privateKey: "\#(Fixtures.path(FakeAppStore.keyFile))", environment: Sandbox, baseUrl: "\#(fake.baseURL)" }"#
    }

    /// `text` parsed with a fresh directory of its own (named after `name`) as the base, where the
    /// backend's database goes; the YAML is kept there as `relay.yaml` for command-line tests.
    public static func parse(_ text: String, name: String) throws -> RelayConfiguration {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName(name))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data(text.utf8).write(to: directory.appendingPathComponent("relay.yaml"))
        return try RelayConfiguration.parse(yaml: text, baseDirectory: directory.path, environment: [:])
    }
}
