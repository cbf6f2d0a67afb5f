import Foundation
import RelayConfig
import RelayCore
import RelayHTTPClient
@testable import RelayLocalBackend
import RelayTestSupport
import Testing

/// The console's sessions and forms over real HTTP: who may sign in, what the cookie is, what a forged,
/// expired or foreign cookie gets, that actions need the session's CSRF token and the secret key, and that
/// guessing keys at the sign-in is slowed down. (A real browser drives it in ConsoleBrowserTests.)
@Suite(.serialized) struct ConsoleTests {
    static let http = HTTPClient()

    static func signIn(_ backend: ScopedBackend, key: String) async throws -> HTTPClientResponse {
        try await http.send(
            "POST", backend.url + "/console/session", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: Array("key=\(key.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)".utf8))
    }

    static func cookie(_ response: HTTPClientResponse) -> String? {
        response.headers.first { $0.name == "set-cookie" }?.value
    }

    static func session(_ response: HTTPClientResponse) -> String? {
        cookie(response)?.split(separator: ";").first.map(String.init)
    }

    static func get(_ backend: ScopedBackend, _ path: String, cookie: String?) async throws -> (status: Int, html: String) {
        let response = try await http.send("GET", backend.url + path, headers: cookie.map { [("Cookie", $0)] } ?? [])
        return (response.status, String(decoding: response.body, as: UTF8.self))
    }

    static func post(_ backend: ScopedBackend, _ path: String, cookie: String?, form: String, origin: String? = nil) async throws -> HTTPClientResponse {
        var headers = [("Content-Type", "application/x-www-form-urlencoded")]
        if let cookie { headers.append(("Cookie", cookie)) }
        if let origin { headers.append(("Origin", origin)) }
        return try await http.send("POST", backend.url + path, headers: headers, body: Array(form.utf8))
    }

    /// The CSRF token a page embeds in its forms.
    static func csrf(_ html: String) -> String? {
        guard let range = html.range(of: "name=\"csrf\" value=\"") else { return nil }
        return String(html[range.upperBound...].prefix(32))
    }

    @Test func onlyTheSecretAndReadKeysSignInAndTheCookieIsHttpOnlyStrictAndExpiring() async throws {
        let backend = try await ScopedBackend()
        try await backend.storeData()
        // Without a session: the sign-in page, with no key needed, and no data.
        let anonymous = try await Self.get(backend, "/console", cookie: nil)
        #expect(anonymous.status == 200)
        #expect(anonymous.html.contains("id=\"sign-in\"") && !anonymous.html.contains("chart-mrr"))
        let unsigned = try await Self.http.send("GET", backend.url + "/console/deliveries")
        #expect(unsigned.status == 303 && unsigned.header("location") == "/console")

        for (key, status) in [("sk_primary_0001", 303), ("sk_rotated_0002", 303), ("rk_ios_0003", 303), ("pk_ios_0005", 403), ("sk_primary_0002", 401), ("", 401)] {
            let response = try await Self.signIn(backend, key: key)
            #expect(response.status == status, "\(key)")
            #expect((Self.cookie(response) != nil) == (status == 303), "\(key)")
        }
        let response = try await Self.signIn(backend, key: "sk_primary_0001")
        let setCookie = try #require(Self.cookie(response))
        #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict") && setCookie.contains("Path=/console"))
        #expect(setCookie.contains("Max-Age=43200"))
        #expect(!setCookie.contains("sk_primary_0001"), "the key is never in the cookie")
        #expect(!setCookie.contains("Secure"), "plain HTTP here")
        #expect(response.header("location") == "/console")
        let secure = try await Self.http.send(
            "POST", backend.url + "/console/session", headers: [("Content-Type", "application/x-www-form-urlencoded"), ("X-Forwarded-Proto", "https")],
            body: Array("key=sk_primary_0001".utf8))
        #expect(Self.cookie(secure)?.contains("; Secure") == true)

        let cookie = try #require(Self.session(response))
        let overview = try await Self.get(backend, "/console", cookie: cookie)
        #expect(overview.status == 200)
        #expect(overview.html.contains("id=\"chart-mrr\"") && overview.html.contains("<svg"))
        #expect(overview.html.contains("secret key"))
        let headers = try await Self.http.send("GET", backend.url + "/console", headers: [("Cookie", cookie)]).headers
        #expect(headers.contains { $0.name == "content-security-policy" && $0.value.contains("default-src 'none'") && $0.value.contains("frame-ancestors 'none'") })
        #expect(headers.contains { $0.name == "cache-control" && $0.value == "no-store" })

        // A changed, truncated or foreign cookie is no session.
        let value = String(cookie.dropFirst("relay_console=".count))
        var forged = Array(value)
        forged[forged.count - 1] = forged.last == "0" ? "1" : "0"
        for bad in [String(forged), String(value.dropLast(2)), value.replacingOccurrences(of: "v1.s.", with: "v1.r."), "v1.s.x.9999999999.00.00"] {
            #expect(try await Self.get(backend, "/console", cookie: "relay_console=\(bad)").html.contains("id=\"sign-in\""), "\(bad)")
            #expect(try await Self.get(backend, "/console/deliveries", cookie: "relay_console=\(bad)").status == 303, "\(bad)")
        }
        // Signing out clears the cookie, from the console's own form only.
        #expect(try await Self.post(backend, "/console/signout", cookie: cookie, form: "").status == 403)
        let token = try #require(Self.csrf(overview.html))
        let out = try await Self.post(backend, "/console/signout", cookie: cookie, form: "csrf=\(token)")
        #expect(Self.cookie(out)?.contains("Max-Age=0") == true)
        await backend.stop()
    }

    @Test func sessionsExpireAndEndWhenTheirKeyIsRemoved() throws {
        let yaml = """
            backend: { apiKey: "sk_one_0001", listen: "127.0.0.1:0", database: "x.sqlite", readKeys: [{ key: "rk_one_0002", apps: [a] }] }
            apps: [{ key: a, projectId: 1, applicationId: 1, stripe: { signingSecrets: [whsec_x] } }]
            """
        let configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: "/tmp", environment: [:])
        let sessions = ConsoleSessions(configuration)
        let now: Int64 = 1_800_000_000_000
        let cookie = try #require(sessions.issue(key: "rk_one_0002", principal: .read(apps: ["a"], applicationIds: [1]), now: now))
        #expect(sessions.session(cookie: cookie, now: now)?.principal == .read(apps: ["a"], applicationIds: [1]))
        #expect(sessions.session(cookie: cookie, now: now + 12 * 3_600_000 - 1_000) != nil)
        #expect(sessions.session(cookie: cookie, now: now + 12 * 3_600_000) == nil, "expired")
        // The read key removed: its sessions end. The secret key rotated: every session ends.
        let withoutReadKey = try RelayConfiguration.parse(yaml: yaml.replacingOccurrences(of: "rk_one_0002", with: "rk_two_0003"), baseDirectory: "/tmp", environment: [:])
        #expect(ConsoleSessions(withoutReadKey).session(cookie: cookie, now: now) == nil)
        let rotated = try RelayConfiguration.parse(yaml: yaml.replacingOccurrences(of: "sk_one_0001", with: "sk_two_0004"), baseDirectory: "/tmp", environment: [:])
        #expect(ConsoleSessions(rotated).session(cookie: cookie, now: now) == nil)
        #expect(sessions.issue(key: "pk", principal: .publicApp(key: "a", applicationId: 1), now: now) == nil)
    }

    @Test func actionsNeedTheSessionsTokenTheSameOriginAndTheSecretKey() async throws {
        let backend = try await ScopedBackend()
        try await backend.storeData()
        let secret = try #require(Self.session(try await Self.signIn(backend, key: "sk_primary_0001")))
        let read = try #require(Self.session(try await Self.signIn(backend, key: "rk_ios_0003")))
        let page = try await Self.get(backend, "/console/deliveries", cookie: secret)
        let token = try #require(Self.csrf(page.html))
        #expect(page.html.contains("Recover failures"))
        let attempt = "hooks-ios:e-ios:-:1:succeeded"
        let form = "id=\(attempt)&csrf=\(token)"
        // No token, a wrong token, another session's token, another site's origin, no session: refused, nothing appended.
        #expect(try await Self.post(backend, "/console/actions/resend", cookie: secret, form: "id=\(attempt)").status == 403)
        #expect(try await Self.post(backend, "/console/actions/resend", cookie: secret, form: "id=\(attempt)&csrf=\(String(repeating: "0", count: 32))").status == 403)
        let readPage = try await Self.get(backend, "/console/deliveries", cookie: read)
        #expect(!readPage.html.contains("/console/actions/"), "a read session's pages offer no actions")
        #expect(!readPage.html.contains("Recover failures"))
        #expect(try await Self.post(backend, "/console/actions/resend", cookie: secret, form: form, origin: "https://evil.example").status == 403)
        #expect(try await Self.post(backend, "/console/actions/resend", cookie: nil, form: form).status == 303)
        // A read key's session with its own valid token: seen, not done.
        let readToken = try #require(Self.csrf(readPage.html), "the sign-out form's token")
        let refused = try await Self.post(backend, "/console/actions/resend", cookie: read, form: "id=\(attempt)&csrf=\(readToken)")
        #expect(refused.status == 403)
        #expect(String(decoding: refused.body, as: UTF8.self).contains("cannot act"))
        for action in ["recover", "enable"] {
            #expect(try await Self.post(backend, "/console/actions/\(action)", cookie: read, form: "endpoint=hooks-ios&since=2020-01-01&csrf=\(readToken)").status == 403)
        }
        #expect(backend.appended.value.isEmpty)

        // The secret key's session with its token: done, and back to the page with a notice.
        let done = try await Self.post(backend, "/console/actions/resend", cookie: secret, form: form + "&back=/console/customers?id=shared-user")
        #expect(done.status == 303)
        let location = try #require(done.header("location"))
        #expect(location.hasPrefix("/console/customers?id=shared-user&notice=Re-sent"), "\(location)")
        // The notice shows on the page it leads to, and only with its signature: a link cannot write on the page.
        #expect(try await Self.get(backend, location, cookie: secret).html.contains("class=\"notice\""))
        let forgedNotice = location.replacingOccurrences(of: "notice=Re-sent", with: "notice=Paste%20your%20key%20at%20evil")
        #expect(!(try await Self.get(backend, forgedNotice, cookie: secret).html.contains("Paste your key")))
        #expect(!(try await Self.get(backend, location, cookie: read).html.contains("class=\"notice\"")), "another session's notice")
        #expect(backend.appended.value.count == 1)
        // A redirect elsewhere is not followed.
        let elsewhere = try await Self.post(backend, "/console/actions/enable", cookie: secret, form: "endpoint=hooks-ios&csrf=\(token)&back=//evil.example/x")
        #expect(elsewhere.header("location")?.hasPrefix("/console/deliveries?notice=Enable") == true, "\(elsewhere.header("location") ?? "")")
        // A read key's session sees only its apps.
        let readCustomer = try await Self.get(backend, "/console/customers?id=shared-user", cookie: read)
        #expect(readCustomer.html.contains("e-ios") && !readCustomer.html.contains("e-android"))
        // An id with a control character names no customer (the database would cut it at a NUL).
        let cut = try await Self.get(backend, "/console/customers?id=shared-user%00x", cookie: read)
        #expect(cut.status == 400 && cut.html.contains("without control characters") && !cut.html.contains("e-ios"))
        let readDeliveries = readPage.html
        #expect(readDeliveries.contains("hooks-ios") && !readDeliveries.contains("hooks-android"))
        #expect(!readDeliveries.contains("secret-token"), "an endpoint's URL is never shown")
        let foreign = try await Self.get(backend, "/console?app=android", cookie: read)
        #expect(foreign.status == 403)
        await backend.stop()
    }

    @Test func guessingKeysAtTheSignInIsSlowedPerClient() async throws {
        let backend = try await ScopedBackend()
        var statuses: [Int] = []
        for index in 0..<11 { statuses.append(try await Self.signIn(backend, key: "sk_guess_\(index)").status) }
        #expect(statuses.prefix(10).allSatisfy { $0 == 401 })
        let limited = try await Self.signIn(backend, key: "sk_primary_0001")
        #expect(limited.status == 429, "even the right key waits: the bucket is per client")
        #expect(limited.header("retry-after") != nil)
        // Six seconds later one more try is allowed.
        backend.limiterClock.withLock { $0 += 6_000_000_000 }
        #expect(try await Self.signIn(backend, key: "sk_primary_0001").status == 303)
        await backend.stop()
    }
}
