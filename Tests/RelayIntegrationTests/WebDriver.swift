import Foundation
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// A headless Chromium driven over the W3C WebDriver protocol by Debian's `chromedriver` (started here on a
/// port it picks), for the console's browser tests. Every step fails with what the page showed, and a
/// screenshot of the page is written next to the failure (its path in the message).
final class WebDriver: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static let chromedriver = URL(fileURLWithPath: "/usr/bin/chromedriver")
    static let chromium = "/usr/bin/chromium"

    private let process: RunningChildProcess
    private let base: String
    private let session: String
    private let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(60))
    private let profile: URL
    let name: String

    /// Starts chromedriver and a browser session with a window of `width` × `height`.
    init(name: String, width: Int = 1280, height: Int = 1000) async throws {
        self.name = name
        guard FileManager.default.isExecutableFile(atPath: Self.chromedriver.path), FileManager.default.isExecutableFile(atPath: Self.chromium) else {
            throw Failure(description: "chromium and chromium-driver are not installed: apt-get install -y chromium chromium-driver (the README's first command does)")
        }
        process = try startChildProcess(Self.chromedriver, ["--port=0"])
        guard let line = await process.line(startingWith: "ChromeDriver was started successfully on port ", within: .seconds(30)),
            let port = Int(line.split(separator: " ").last?.trimmingCharacters(in: CharacterSet(charactersIn: ".\r\n ")) ?? "")
        else {
            process.killIfRunning()
            throw Failure(description: "chromedriver did not start: \(await process.result().stderr)")
        }
        base = "http://127.0.0.1:\(port)"
        profile = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("chromium-profile"))
        let capabilities: JSON = [
            "capabilities": [
                "alwaysMatch": [
                    "browserName": "chrome",
                    "goog:chromeOptions": [
                        "binary": .string(Self.chromium),
                        "args": .array(
                            ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--window-size=\(width),\(height)",
                                "--user-data-dir=\(profile.path)"].map(JSON.string)),
                    ],
                ]
            ]
        ]
        let response = try await http.send("POST", base + "/session", headers: [("Content-Type", "application/json")], body: capabilities.serialized())
        guard let id = (try? JSON.parse(response.body))?["value"]?["sessionId"]?.stringValue else {
            process.killIfRunning()
            throw Failure(description: "no browser session: HTTP \(response.status) \(String(decoding: response.body, as: UTF8.self).prefix(500))")
        }
        session = id
    }

    @discardableResult
    private func command(_ method: String, _ path: String, _ body: JSON? = nil) async throws -> JSON {
        let response = try await http.send(
            method, base + "/session/\(session)" + path, headers: [("Content-Type", "application/json")], body: (body ?? (method == "POST" ? [:] : nil))?.serialized())
        let document = (try? JSON.parse(response.body)) ?? .null
        guard response.status == 200 else {
            throw Failure(description: "\(method) \(path): HTTP \(response.status) \(document["value"]?["message"]?.stringValue ?? "")")
        }
        return document["value"] ?? .null
    }

    func open(_ url: String) async throws { try await command("POST", "/url", ["url": .string(url)]) }

    func currentURL() async throws -> String { try await command("GET", "/url").stringValue ?? "" }

    /// The element `selector` matches, waiting for it up to 10 s.
    func element(_ selector: String) async throws -> String {
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            let found = try await command("POST", "/elements", ["using": "css selector", "value": .string(selector)])
            if let first = found.arrayValue?.first?.objectValue?.values.first?.stringValue { return first }
            guard ContinuousClock.now < deadline else { throw try await failure("no element matches \(selector)") }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    func count(_ selector: String) async throws -> Int {
        try await command("POST", "/elements", ["using": "css selector", "value": .string(selector)]).arrayValue?.count ?? 0
    }

    func type(_ selector: String, _ text: String) async throws {
        try await command("POST", "/element/\(try await element(selector))/value", ["text": .string(text)])
    }

    func click(_ selector: String) async throws {
        try await command("POST", "/element/\(try await element(selector))/click")
    }

    func text(_ selector: String) async throws -> String {
        try await command("GET", "/element/\(try await element(selector))/text").stringValue ?? ""
    }

    /// Runs `script` in the page (through the driver, which the page's CSP does not apply to).
    func evaluate(_ script: String) async throws -> JSON {
        try await command("POST", "/execute/sync", ["script": .string(script), "args": []])
    }

    func resize(width: Int, height: Int) async throws {
        try await command("POST", "/window/rect", ["width": .integer(Int64(width)), "height": .integer(Int64(height))])
    }

    func deleteCookies() async throws { try await command("DELETE", "/cookie") }

    /// The page as PNG.
    func screenshot() async throws -> Data {
        guard let encoded = try await command("GET", "/screenshot").stringValue, let data = Data(base64Encoded: encoded) else {
            throw Failure(description: "no screenshot")
        }
        return data
    }

    /// A failure that says what the page showed and where its screenshot is.
    func failure(_ what: String) async throws -> Failure {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-failure-\(uniqueName("shot")).png")
        let saved = (try? await screenshot()).map { data in (try? data.write(to: file)) != nil } ?? false
        let url = (try? await currentURL()) ?? "?"
        let body = (try? await evaluate("return document.body ? document.body.innerText.slice(0, 800) : ''"))?.stringValue ?? ""
        return Failure(description: "\(what) at \(url)\(saved ? "; screenshot: \(file.path)" : ""); the page says: \(body)")
    }

    /// Waits up to 10 s for `condition` on the page, else fails with a screenshot. A step that throws (the
    /// page navigated away under it: a stale element) counts as not yet.
    func waitFor(_ what: String, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        var lastError: (any Error)?
        while true {
            do {
                if try await condition() { return }
            } catch {
                lastError = error
            }
            guard ContinuousClock.now < deadline else { throw try await failure("waited for \(what)\(lastError.map { " (last error: \($0))" } ?? "")") }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// `condition`, or a recorded issue with a screenshot.
    func check(_ condition: Bool, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) async {
        guard !condition else { return }
        let failure = (try? await failure(what))?.description ?? what
        Issue.record(Comment(rawValue: failure), sourceLocation: sourceLocation)
    }

    func quit() async {
        _ = try? await http.send("DELETE", base + "/session/\(session)")
        process.signal(SIGTERM)
        _ = await process.result()
        try? FileManager.default.removeItem(at: profile)
    }
}
