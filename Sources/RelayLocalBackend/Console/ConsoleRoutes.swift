import Foundation
import HTTPTypes
public import Hummingbird
import NIOCore
import RelayConfig
import RelayCore

/// The web console at `/console` (docs/console.md): pages rendered here from the same functions the routes
/// answer with, behind a session a secret or read key opens. A read key's session sees its apps and cannot
/// act; the secret key's acts through forms that carry the session's CSRF token.
extension LocalBackend {
    static let consolePath = "/console"

    /// Whether a path is the console's (the authentication middleware lets these through: the console
    /// checks its own session).
    static func isConsole(_ path: String) -> Bool { path == consolePath || path.hasPrefix(consolePath + "/") }

    func addConsoleRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        router.on(RouterPath(Self.consolePath), method: .get) { request, _ in
            guard let session = backend.consoleSession(request) else { return backend.signInPage(request) }
            return try await backend.overviewPage(request, session)
        }
        router.on(RouterPath(Self.consolePath + "/session"), method: .post) { request, context in
            try await backend.signIn(request, context)
        }
        router.on(RouterPath(Self.consolePath + "/signout"), method: .post) { request, _ in
            // Only the console's own form signs out (its token), so another site cannot sign a user out.
            if let session = backend.consoleSession(request) {
                guard Self.sameOrigin(request), ConsoleSessions.matches(try await Self.form(request)["csrf"], session.csrf) else {
                    return backend.page("Refused", session, active: "", status: .forbidden, body: "<p class=\"error\">This sign-out did not come from this console.</p>")
                }
            }
            var response = Self.redirect(Self.consolePath)
            response.headers[values: .setCookie] = [Self.sessionCookie("", maxAge: 0, secure: Self.isSecure(request))]
            return response
        }
        router.on(RouterPath(Self.consolePath + "/customers"), method: .get) { request, _ in
            guard let session = backend.consoleSession(request) else { return Self.redirect(Self.consolePath) }
            return try await backend.customerPage(request, session)
        }
        router.on(RouterPath(Self.consolePath + "/deliveries"), method: .get) { request, _ in
            guard let session = backend.consoleSession(request) else { return Self.redirect(Self.consolePath) }
            return try await backend.deliveriesPage(request, session)
        }
        router.on(RouterPath(Self.consolePath + "/rejected"), method: .get) { request, _ in
            guard let session = backend.consoleSession(request) else { return Self.redirect(Self.consolePath) }
            return try await backend.rejectedPage(request, session)
        }
        for action in ["resend", "recover", "enable"] {
            router.on(RouterPath(Self.consolePath + "/actions/" + action), method: .post) { request, _ in
                try await backend.consoleAction(action, request)
            }
        }
    }

    // MARK: Sessions

    func consoleSession(_ request: Request) -> ConsoleSessions.Session? {
        guard let cookie = Self.cookie(ConsoleSessions.cookieName, in: request) else { return nil }
        return consoleSessions.session(cookie: cookie, now: clock())
    }

    static func cookie(_ name: String, in request: Request) -> String? {
        for header in request.headers[values: .cookie] {
            for pair in header.split(separator: ";") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                if parts.count == 2, parts[0].trimmingCharacters(in: .whitespaces) == name { return String(parts[1]).trimmingCharacters(in: .whitespaces) }
            }
        }
        return nil
    }

    /// Behind a TLS-terminating proxy that says so, the cookie is `Secure`.
    static func isSecure(_ request: Request) -> Bool {
        request.headers[HTTPField.Name("X-Forwarded-Proto")!]?.lowercased().hasPrefix("https") == true
    }

    static func sessionCookie(_ value: String, maxAge: Int64, secure: Bool) -> String {
        "\(ConsoleSessions.cookieName)=\(value); Path=\(consolePath); Max-Age=\(maxAge); HttpOnly; SameSite=Strict\(secure ? "; Secure" : "")"
    }

    /// A form's fields (`application/x-www-form-urlencoded`), at most 16 KiB.
    static func form(_ request: Request) async throws -> [String: String] {
        let body = try await request.body.collect(upTo: 16 * 1024)
        var fields: [String: String] = [:]
        for pair in String(buffer: body).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" }
            if let name = parts.first, fields[name] == nil { fields[name] = parts.count > 1 ? parts[1] : "" }
        }
        return fields
    }

    /// A post from another site is refused even before its token is checked: its `Origin` names another host
    /// than the request's (`X-Forwarded-Host` when a proxy set it, else `Host`). Ports are not compared: a
    /// proxy may publish the console on another port than the backend listens on.
    static func sameOrigin(_ request: Request) -> Bool {
        guard let origin = request.headers[HTTPField.Name("Origin")!] else { return true }
        let forwarded = request.headers[HTTPField.Name("X-Forwarded-Host")!]?.split(separator: ",").first.map { String($0).trimmingCharacters(in: .whitespaces) }
        guard let authority = forwarded ?? request.headers[HTTPField.Name("Host")!] ?? request.head.authority,
            let originHost = URL(string: origin)?.host
        else { return false }
        return hostName(authority) == hostName(originHost)
    }

    /// The host of an authority (`host`, `host:port`, `[v6]:port`), lower-cased, without brackets or port.
    static func hostName(_ authority: String) -> String {
        var text = authority.lowercased()
        if text.hasPrefix("[") {
            text = String(text.dropFirst().prefix { $0 != "]" })
        } else if text.filter({ $0 == ":" }).count == 1, let colon = text.firstIndex(of: ":") {
            text = String(text[..<colon])
        }
        return text
    }

    private func signIn(_ request: Request, _ context: BackendRequestContext) async throws -> Response {
        guard Self.sameOrigin(request) else { return signInPage(request, problem: "This sign-in came from another site.", status: .forbidden) }
        // Guessing keys is slow: 10 tries a client (as the public routes' limit resolves it), then one every 6 seconds.
        if case .limited(let seconds) = signInLimiter.take(context.clientKey ?? context.peerAddress ?? "unknown") {
            var response = signInPage(request, problem: "Too many sign-ins from here; try again in \(seconds) s.", status: .tooManyRequests)
            response.headers[.retryAfter] = String(seconds)
            return response
        }
        let key = (try await Self.form(request)["key"] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        switch keys.principal(authorization: "Bearer " + key) {
        case .some(let principal) where principal.isConsoleKind:
            guard let cookie = consoleSessions.issue(key: key, principal: principal, now: clock()) else {
                return signInPage(request, problem: "The session could not be made; try again.", status: .internalServerError)
            }
            var response = Self.redirect(Self.consolePath)
            response.headers[values: .setCookie] = [Self.sessionCookie(cookie, maxAge: ConsoleSessions.lifetimeSeconds, secure: Self.isSecure(request))]
            return response
        case .some:
            accessRefusals.increment([("status", "403")])
            return signInPage(request, problem: "An app's public key cannot sign in: use the secret key or a read key.", status: .forbidden)
        case .none:
            accessRefusals.increment([("status", "401")])
            return signInPage(request, problem: "This backend does not know that key.", status: .unauthorized)
        }
    }

    // MARK: Actions

    private func consoleAction(_ action: String, _ request: Request) async throws -> Response {
        guard let session = consoleSession(request) else { return Self.redirect(Self.consolePath) }
        let fields = try await Self.form(request)
        guard Self.sameOrigin(request), ConsoleSessions.matches(fields["csrf"], session.csrf) else {
            accessRefusals.increment([("status", "403")])
            return page("Refused", session, active: "", status: .forbidden, body: "<p class=\"error\">This form did not come from this console session (its token is missing or wrong). Reload the page and try again.</p>")
        }
        guard case .secret = session.principal else {
            accessRefusals.increment([("status", "403")])
            return page("Refused", session, active: "", status: .forbidden, body: "<p class=\"error\">A read key sees the console but cannot act: sign in with the secret key.</p>")
        }
        let result: ActionResult
        switch action {
        case "resend": result = try await resend(attemptId: fields["id"])
        case "recover": result = try await recover(endpoint: fields["endpoint"], since: fields["since"], until: fields["until"])
        default: result = try await enable(endpoint: fields["endpoint"])
        }
        let notice: String
        if result.succeeded {
            switch action {
            case "resend": notice = "Re-sent \(result.body["eventId"]?.stringValue ?? "") to \(result.body["endpoint"]?.stringValue ?? "")."
            case "recover":
                notice = "Recover of \(result.body["endpoint"]?.stringValue ?? ""): \(result.body["resent"]?.int64Value ?? 0) re-sent, "
                    + "\(result.body["alreadyResent"]?.int64Value ?? 0) already re-sent before\(result.body["more"]?.boolValue == true ? "; more are left: recover again" : "")."
            default: notice = "Enable of \(result.body["endpoint"]?.stringValue ?? "") requested from every deliverer."
            }
        } else {
            notice = "Not done: \(result.message)"
        }
        let back = fields["back"].flatMap { $0.hasPrefix(Self.consolePath + "/") && !$0.contains("//") ? $0 : nil } ?? Self.consolePath + "/deliveries"
        let separator = back.contains("?") ? "&" : "?"
        // Signed with the session's key: the page shows only a notice this console wrote for this session.
        let signature = consoleSessions.noticeSignature(notice, csrf: session.csrf)
        return Self.redirect(back + separator + "notice=" + HTML.query(notice) + "&sig=" + signature + (result.succeeded ? "" : "&failed=1"))
    }

    static func redirect(_ location: String) -> Response {
        Response(status: .seeOther, headers: [.location: location, .cacheControl: "no-store"])
    }

    // MARK: Pages

    /// The console's frame: navigation, the notice of the last action, and `body`.
    func page(
        _ title: String, _ session: ConsoleSessions.Session?, active: String, status: HTTPResponse.Status = .ok, notice: String? = nil, failed: Bool = false,
        body: String
    ) -> Response {
        var nav = ""
        if let session {
            let links = [("overview", "Overview", Self.consolePath), ("customers", "Customers", Self.consolePath + "/customers"),
                ("deliveries", "Deliveries", Self.consolePath + "/deliveries"), ("rejected", "Rejected", Self.consolePath + "/rejected")]
            nav = "<nav>" + links.map { id, name, href in "<a href=\"\(href)\"\(id == active ? " class=\"active\"" : "")>\(name)</a>" }.joined()
            nav += "<span class=\"who\">\(HTML.escape(session.principal.consoleLabel))</span>"
            nav += "<form method=\"post\" action=\"\(Self.consolePath)/signout\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"\(session.csrf)\">"
            nav += "<button type=\"submit\" class=\"link\" id=\"sign-out\">Sign out</button></form></nav>"
        }
        let banner = notice.map { "<p class=\"\(failed ? "error" : "notice")\" role=\"status\">\(HTML.escape($0))</p>" } ?? ""
        let html = """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(HTML.escape(title)) · revenue-relay</title><style>\(Self.styles)</style></head>
            <body><header><strong>revenue-relay</strong>\(nav)</header><main>
            <h1>\(HTML.escape(title))</h1>\(banner)
            \(body)
            </main></body></html>
            """
        var headers: HTTPFields = [
            .contentType: "text/html; charset=utf-8", .cacheControl: "no-store",
            HTTPField.Name("Content-Security-Policy")!: "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            HTTPField.Name("X-Frame-Options")!: "DENY", HTTPField.Name("Referrer-Policy")!: "same-origin",
            HTTPField.Name("X-Content-Type-Options")!: "nosniff",
        ]
        headers[.contentLength] = String(html.utf8.count)
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: html)))
    }

    func signInPage(_ request: Request, problem: String? = nil, status: HTTPResponse.Status = .ok) -> Response {
        page(
            "Sign in", nil, active: "", status: status, notice: problem, failed: problem != nil,
            body: """
                <form method="post" action="\(Self.consolePath)/session" class="card signin">
                <label for="key">Secret key or read key</label>
                <input id="key" name="key" type="password" autocomplete="current-password" required autofocus>
                <button type="submit" id="sign-in">Sign in</button>
                <p class="muted">The key is exchanged for a session cookie (12 hours) and not kept in the browser. A read key sees its
                apps and cannot act; an app's public key cannot sign in.</p>
                </form>
                """)
    }

    static let styles = """
        *{box-sizing:border-box}body{margin:0;font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2330;background:#f5f6f8}
        header{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;padding:.6rem 1rem;background:#1d2330;color:#fff}
        header nav{display:flex;flex-wrap:wrap;gap:.25rem .9rem;align-items:center;flex:1}header a{color:#cfd6e4;text-decoration:none}
        header a.active{color:#fff;border-bottom:2px solid #6ea8fe}.who{margin-left:auto;color:#9aa5b8;font-size:.85em}
        main{max-width:1180px;margin:0 auto;padding:1rem}h1{font-size:1.4rem;margin:.2rem 0 1rem}h2{font-size:1.1rem;margin:1.6rem 0 .6rem}
        .cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:.75rem}
        .card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:.8rem 1rem}.card b{display:block;font-size:1.35rem}
        .card span{color:#5b6475;font-size:.85em}.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,480px),1fr));gap:.75rem}
        figure.chart{margin:0;background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:.6rem}figure svg{width:100%;height:auto;display:block}
        figcaption{font-weight:600;margin-bottom:.3rem}.grid{stroke:#e6e9ef}.axis{font-size:11px;fill:#5b6475}
        .legend{display:flex;flex-wrap:wrap;gap:.8rem;font-size:.85em;color:#5b6475}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
        .scroll{overflow-x:auto;background:#fff;border:1px solid #dde1e8;border-radius:8px}table{border-collapse:collapse;width:100%;font-size:.9em}
        th,td{text-align:left;padding:.45rem .6rem;border-bottom:1px solid #eef0f4;white-space:nowrap}th{background:#fafbfc;font-weight:600}
        td.wrap,td .wrap{white-space:normal;word-break:break-word}.muted{color:#5b6475}.notice{background:#e7f5ec;border:1px solid #9fd3b0;padding:.5rem .8rem;border-radius:6px}
        .error{background:#fdecec;border:1px solid #f1a7a7;padding:.5rem .8rem;border-radius:6px}
        .badge{display:inline-block;padding:.05rem .45rem;border-radius:999px;font-size:.8em;background:#eef0f4}.ok{background:#dff3e6;color:#14532d}
        .bad{background:#fde2e2;color:#7f1d1d}.warn{background:#fff1d6;color:#7a4b00}form.inline{display:inline}
        button{font:inherit;padding:.35rem .8rem;border-radius:6px;border:1px solid #2f5bd3;background:#3b6cf0;color:#fff;cursor:pointer}
        button.link{background:none;border:none;color:#cfd6e4;padding:0}input,select{font:inherit;padding:.35rem .5rem;border:1px solid #c4cad6;border-radius:6px;max-width:100%}
        form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin-bottom:1rem}form.filters label{display:flex;flex-direction:column;font-size:.85em;color:#5b6475}
        .signin{max-width:420px;display:flex;flex-direction:column;gap:.6rem}dl.defs dt{font-weight:600;margin-top:.6rem}dl.defs dd{margin:.1rem 0 0 0;color:#3b4354}
        code{background:#eef0f4;padding:0 .25rem;border-radius:4px;font-size:.9em;word-break:break-all}
        @media (max-width:600px){main{padding:.6rem}th,td{padding:.35rem .4rem}.card b{font-size:1.15rem}}
        """
}

extension BackendPrincipal {
    /// The kinds of key that may open a console session.
    var isConsoleKind: Bool {
        switch self {
        case .secret, .read: true
        case .publicApp: false
        }
    }

    var consoleLabel: String {
        switch self {
        case .secret: "secret key"
        case .read(let apps, _): "read key · \(apps.sorted().joined(separator: ", "))"
        case .publicApp: "public key"
        }
    }
}
