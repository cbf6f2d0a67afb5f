import Foundation
import Hummingbird
import RelayConfig
import RelayCore

/// The console's pages: the overview (metrics and revenue), a customer, deliveries and endpoints, and
/// rejected notifications. Each reads what the matching route reads, narrowed to the session's apps.
extension LocalBackend {
    static let consoleDays = [7, 30, 90, 365]

    /// The apps a session reads (all for the secret key).
    func consoleApps(_ principal: BackendPrincipal) -> [RelayConfiguration.App] {
        configuration.apps.filter { app in principal.apps.map { $0.contains(app.key) } ?? true }
    }

    private func appSelect(_ principal: BackendPrincipal, selected: String?, name: String = "app", value: (RelayConfiguration.App) -> String = { $0.key }) -> String {
        let apps = consoleApps(principal)
        var options = apps.count > 1 || name == "app" ? ["<option value=\"\">all apps</option>"] : []
        options += apps.map { app in
            let option = value(app)
            return "<option value=\"\(HTML.escape(option))\"\(option == selected ? " selected" : "")>\(HTML.escape(app.key))</option>"
        }
        return "<label>App<select name=\"\(name)\">\(options.joined())</select></label>"
    }

    /// The last action's notice, when this console signed it for this session (a link cannot put words on the page).
    private func notice(_ request: Request, _ session: ConsoleSessions.Session) -> (String?, Bool) {
        let parameters = request.uri.queryParameters
        guard let notice = parameters.get("notice"),
            ConsoleSessions.matches(parameters.get("sig"), consoleSessions.noticeSignature(notice, csrf: session.csrf))
        else { return (nil, false) }
        return (notice, parameters.get("failed") != nil)
    }

    // MARK: Overview

    func overviewPage(_ request: Request, _ session: ConsoleSessions.Session) async throws -> Response {
        let parameters = request.uri.queryParameters
        let days = parameters.get("days").flatMap(Int.init).flatMap { Self.consoleDays.contains($0) ? $0 : nil } ?? 30
        // "all apps" is an empty `app`: no filter but the key's own apps.
        let query = parameters.get("app") == "" ? Hummingbird.Parameters() : parameters
        let filter: EventFilter
        switch Result(catching: { () throws(EventQueryParameters.Invalid) in
            try EventQueryParameters.filter(query, defaultEnvironment: "PRODUCTION", readableBy: session.principal)
        }) {
        case .success(let found): filter = found
        case .failure(let invalid):
            return page(
                "Overview", session, active: "overview", status: invalid.forbidden ? .forbidden : .badRequest,
                body: "<p class=\"error\">\(HTML.escape(invalid.message))</p>")
        }
        let now = clock()
        let until = EventStore.dayStart(now) + 86_400_000
        let since = until - Int64(days) * 86_400_000
        // One day more at the start: the active count the churn rate is measured against.
        let all = try await events.metrics(filter, since: since - 86_400_000, until: until, now: now)
        let before = all.first
        let range = Array(all.dropFirst())
        let last = range.last
        let sum = { (field: (EventStore.MetricsDay) -> Int) in range.map(field).reduce(0, +) }
        let sumUsd = { (field: (EventStore.MetricsDay) -> Double) in range.map(field).reduce(0, +) }
        let conversions = sum(\.trialConversions)
        let trialEnds = conversions + sum(\.trialExpirations)
        let churned = sum(\.churned)
        let startActive = before?.activeSubscriptions ?? 0
        var revenueFilter = filter
        revenueFilter.since = since
        revenueFilter.until = until
        let byProduct = try await events.revenue(revenueFilter, groupBy: [.product])
        let byStore = try await events.revenue(revenueFilter, groupBy: [.store])

        let labels = range.map { String(Timestamp.rfc3339(milliseconds: $0.day).dropFirst(5).prefix(5)) }
        let cards: [(String, String, String)] = [
            ("mrr", HTML.money(last?.mrrUsd ?? 0), "MRR (USD)"),
            ("active", String(last?.activeSubscriptions ?? 0), "active subscriptions"),
            ("trials", String(last?.activeTrials ?? 0), "active trials"),
            ("new", String(sum(\.newSubscriptions)), "new subscriptions, \(days) days"),
            ("conversion", HTML.percent(trialEnds > 0 ? Double(conversions) / Double(trialEnds) : nil), "trial conversion (\(conversions) of \(trialEnds) ended trials)"),
            ("churn", HTML.percent(startActive > 0 ? Double(churned) / Double(startActive) : nil), "churn (\(churned) of \(startActive) active at the start)"),
            ("refunds", "\(sum(\.refunds)) · \(HTML.money(sumUsd(\.refundsUsd)))", "refunds"),
            ("net", HTML.money(sumUsd(\.netUsd)), "net revenue (USD)"),
        ]
        let appQuery = filter.app.map { "&app=" + HTML.query($0) } ?? ""
        let sinceText = String(Timestamp.rfc3339(milliseconds: since).prefix(10))
        let untilText = String(Timestamp.rfc3339(milliseconds: until).prefix(10))
        let lastDayText = String(Timestamp.rfc3339(milliseconds: until - 86_400_000).prefix(10))
        let money: (Double) -> String = { value in abs(value) >= 1000 ? String(format: "$%.1fk", value / 1000) : String(format: "$%.0f", value) }
        let count: (Double) -> String = { String(format: "%.0f", $0) }
        let charts = [
            SVGChart.render(
                title: "MRR (USD)", id: "chart-mrr", labels: labels, series: [ChartSeries(name: "MRR", color: "#3b6cf0", values: range.map(\.mrrUsd))], bars: false,
                format: money),
            SVGChart.render(
                title: "Active subscriptions and trials", id: "chart-active", labels: labels,
                series: [
                    ChartSeries(name: "subscriptions", color: "#3b6cf0", values: range.map { Double($0.activeSubscriptions) }),
                    ChartSeries(name: "trials", color: "#e0962b", values: range.map { Double($0.activeTrials) }),
                ], bars: false, wholeNumbers: true, format: count),
            SVGChart.render(
                title: "New, converted, churned and refunded per day", id: "chart-movements", labels: labels,
                series: [
                    ChartSeries(name: "new subscriptions", color: "#2f9e5b", values: range.map { Double($0.newSubscriptions) }),
                    ChartSeries(name: "trial conversions", color: "#3b6cf0", values: range.map { Double($0.trialConversions) }),
                    ChartSeries(name: "churned", color: "#d64545", values: range.map { Double($0.churned) }),
                    ChartSeries(name: "refunds", color: "#8a5cd6", values: range.map { Double($0.refunds) }),
                ], bars: true, wholeNumbers: true, format: count),
            SVGChart.render(
                title: "Net revenue per day (USD)", id: "chart-net", labels: labels,
                series: [ChartSeries(name: "net", color: "#2f9e5b", values: range.map(\.netUsd))], bars: true, format: money),
        ]
        func revenueTable(_ report: RevenueReport, _ key: String, _ name: String) -> String {
            HTML.table(
                [name, "gross", "refunds", "net", "proceeds", "purchases"],
                report.rows.sorted { $0.net > $1.net }.map { row in
                    [HTML.escape((row.group[key] ?? nil) ?? "–"), HTML.money(row.gross), HTML.money(row.refunds), HTML.money(row.net), HTML.money(row.proceeds), String(row.purchases)]
                }, empty: "No revenue in these days.")
        }
        let body = """
            <form class="filters" method="get" action="\(Self.consolePath)">
            \(appSelect(session.principal, selected: filter.app))
            <label>Days<select name="days">\(Self.consoleDays.map { "<option value=\"\($0)\"\($0 == days ? " selected" : "")>\($0)</option>" }.joined())</select></label>
            <button type="submit">Show</button></form>
            <p class="muted">\(sinceText) to \(lastDayText) (UTC days, production events; today so far).</p>
            <div class="cards">\(cards.map { id, value, label in "<div class=\"card\" id=\"card-\(id)\"><b>\(value)</b><span>\(HTML.escape(label))</span></div>" }.joined())</div>
            <h2>Trends</h2><div class="charts">\(charts.joined())</div>
            <h2>Revenue by product</h2>\(revenueTable(byProduct, "product", "product"))
            <h2>Revenue by store</h2>\(revenueTable(byStore, "store", "store"))
            <h2>Definitions</h2>
            <dl class="defs">
            <dt>MRR</dt><dd>The monthly recurring revenue of the subscriptions active at the end of each day: each one's current period's price in USD (converted with <code>money.exchangeRates</code>), normalized to a month by the period's standard length (a weekly price × 52/12, an annual price ÷ 12). Trials and promotional grants count 0. Store fees are not taken off.</dd>
            <dt>Active</dt><dd>A subscription in a paid period at the end of the day: its latest purchase or renewal covers that instant and it has not expired or been refunded (an App Store refund revokes access) before. Active trials are the same for trial periods.</dd>
            <dt>New subscriptions</dt><dd>First paid periods: a paid initial purchase, or a trial's conversion.</dd>
            <dt>Trial conversion</dt><dd>Trials that converted, out of the trials that ended in the range (converted or expired).</dd>
            <dt>Churn</dt><dd>Paid subscriptions whose access ended in the range (an expiration outside a trial or a grant), out of those active at the end of the day before the range.</dd>
            <dt>Refunds, net revenue</dt><dd>Refunds as the stores report them; net revenue is purchases and renewals less refunds, in USD, as the revenue route counts it.</dd>
            </dl>
            <p class="muted">The same numbers for a script: <code>GET /subscriptions-api/internal/v1/metrics?since=\(sinceText)&amp;until=\(untilText)\(HTML.escape(appQuery))</code> and <code>GET /subscriptions-api/internal/v1/revenue?since=\(sinceText)&amp;until=\(untilText)&amp;groupBy=product\(HTML.escape(appQuery))</code>.</p>
            """
        let (notice, failed) = notice(request, session)
        return page("Overview", session, active: "overview", notice: notice, failed: failed, body: body)
    }

    // MARK: Customer

    func customerPage(_ request: Request, _ session: ConsoleSessions.Session) async throws -> Response {
        let parameters = request.uri.queryParameters
        let id = parameters.get("id")?.trimmingCharacters(in: .whitespaces) ?? ""
        let applicationId = parameters.get("applicationId").flatMap { $0.isEmpty ? nil : $0 }
        var body = """
            <form class="filters" method="get" action="\(Self.consolePath)/customers">
            <label>App user id, alias or device id<input name="id" id="customer-id" value="\(HTML.escape(id))" required></label>
            \(appSelect(session.principal, selected: applicationId, name: "applicationId", value: { String($0.applicationId) }))
            <button type="submit" id="look-up">Look up</button></form>
            """
        let (notice, failed) = notice(request, session)
        guard !id.isEmpty else { return page("Customers", session, active: "customers", notice: notice, failed: failed, body: body) }
        guard Self.isValidId(id) else {
            return page(
                "Customers", session, active: "customers", status: .badRequest, notice: notice, failed: failed,
                body: body + "<p class=\"error\">An id is at most \(Self.maximumIdBytes) bytes, without control characters.</p>")
        }
        let app: RelayConfiguration.App
        switch readableApp(applicationId: applicationId, principal: session.principal) {
        case .success(let found): app = found
        case .failure:
            return page("Customers", session, active: "customers", status: .badRequest, notice: notice, failed: failed, body: body + "<p class=\"error\">Choose one of this key's apps.</p>")
        }
        let customer = try await self.customer(id, app: app)
        let user = customer["appUserId"]?.stringValue ?? id
        var deliveryFilter = DeliveryLog.Filter()
        deliveryFilter.appUserId = user
        deliveryFilter.app = app.key
        let attempts = try await deliveryLog.page(deliveryFilter, before: nil, limit: 200).attempts
        let entitlements = (customer["customerInfo"]?["entitlements"]?.arrayValue ?? []).map { entitlement -> String in
            let active = entitlement["isActive"]?.boolValue == true
            return "<span class=\"badge \(active ? "ok" : "")\">\(HTML.escape(entitlement["id"]?.stringValue ?? entitlement["identifier"]?.stringValue ?? "?"))\(active ? " · active" : "")</span>"
        }
        let ids = Set(([customer["appUserId"]] + (customer["aliases"]?.arrayValue ?? []) + (customer["ids"]?.arrayValue ?? [])).compactMap { $0?.stringValue }).sorted()
        body += """
            <div class="cards"><div class="card" id="customer-user"><b class="wrap">\(HTML.escape(user))</b><span>app user in \(HTML.escape(app.key))</span></div>
            <div class="card"><span>ids</span><div class="wrap">\(ids.map { "<code>\(HTML.escape($0))</code>" }.joined(separator: " "))</div></div>
            <div class="card" id="customer-entitlements"><span>entitlements</span><div>\(entitlements.isEmpty ? "<span class=\"muted\">none</span>" : entitlements.joined(separator: " "))</div></div></div>
            <h2>Subscriptions</h2>
            """
        body += HTML.table(
            ["store", "subscription", "product", "status", "expires", "owner"],
            (customer["subscriptions"]?.arrayValue ?? []).map { state in
                [
                    HTML.escape(state["store"]?.stringValue ?? ""), "<code>\(HTML.escape(state["originalTransactionId"]?.stringValue ?? ""))</code>",
                    HTML.escape(state["productId"]?.stringValue ?? ""), Self.badge(state["status"]?.stringValue ?? ""),
                    HTML.time(state["expiresAt"]?.int64Value), HTML.escape(state["ownerAppUserId"]?.stringValue ?? state["originalAppUserId"]?.stringValue ?? ""),
                ]
            }, empty: "No subscriptions for this user in \(app.key).")
        body += "<h2>Timeline</h2>" + HTML.table(
            ["time", "event", "product", "price (USD)", "store", "id"],
            (customer["events"]?.arrayValue ?? []).map { event in
                let data = event["data"]
                return [
                    HTML.time(data?["ts"]?.int64Value), HTML.escape(event["type"]?.stringValue ?? data?["name"]?.stringValue ?? ""),
                    HTML.escape(data?["productId"]?.stringValue ?? ""), data?["price"]?.doubleValue.map(HTML.money) ?? "–",
                    HTML.escape(data?["store"]?.stringValue ?? ""), "<code>\(HTML.escape(data?["id"]?.stringValue ?? ""))</code>",
                ]
            }, empty: "No events yet.")
        let back = Self.consolePath + "/customers?id=" + HTML.query(id) + (applicationId.map { "&applicationId=" + HTML.query($0) } ?? "")
        body += "<h2>Webhooks sent about them</h2>" + attemptsTable(attempts, session, back: back, empty: "No webhook attempts recorded for this user.")
        return page("Customer", session, active: "customers", notice: notice, failed: failed, body: body)
    }

    static func badge(_ status: String) -> String {
        let kind: String
        switch status {
        case "succeeded", "ACTIVE", "active", "closed": kind = "ok"
        case "dead", "EXPIRED", "expired", "REVOKED", "open", "disabled": kind = "bad"
        case "retrying", "throttled", "IN_GRACE_PERIOD", "IN_BILLING_RETRY", "paused": kind = "warn"
        default: kind = ""
        }
        return "<span class=\"badge \(kind)\">\(HTML.escape(status))</span>"
    }

    /// Attempts as rows, each with a resend button for the secret key.
    func attemptsTable(_ attempts: [JSON], _ session: ConsoleSessions.Session, back: String, empty: String) -> String {
        let canAct = session.principal == .secret
        return HTML.table(
            ["finished", "endpoint", "event", "type", "attempt", "outcome", "HTTP", "error", canAct ? "" : nil].compactMap { $0 },
            attempts.map { attempt in
                var row = [
                    HTML.time(attempt["finishedAt"]?.int64Value), HTML.escape(attempt["endpoint"]?.stringValue ?? ""),
                    "<code>\(HTML.escape(attempt["eventId"]?.stringValue ?? ""))</code>", HTML.escape(attempt["eventType"]?.stringValue ?? ""),
                    String(attempt["attempt"]?.int64Value ?? 0) + (attempt["replayedFrom"]?.stringValue != nil ? " (re-sent)" : ""),
                    Self.badge(attempt["outcome"]?.stringValue ?? ""), attempt["httpStatus"]?.int64Value.map(String.init) ?? "–",
                    "<span class=\"wrap\">\(HTML.escape(attempt["error"]?.stringValue ?? ""))</span>",
                ]
                if canAct, let id = attempt["id"]?.stringValue {
                    row.append(resendForm(id, session, back: back))
                }
                return row
            }, empty: empty)
    }

    func resendForm(_ id: String, _ session: ConsoleSessions.Session, back: String) -> String {
        """
        <form method="post" action="\(Self.consolePath)/actions/resend" class="inline"><input type="hidden" name="csrf" value="\(session.csrf)">\
        <input type="hidden" name="id" value="\(HTML.escape(id))"><input type="hidden" name="back" value="\(HTML.escape(back))">\
        <button type="submit" class="resend" data-id="\(HTML.escape(id))">Resend</button></form>
        """
    }

    // MARK: Deliveries

    func deliveriesPage(_ request: Request, _ session: ConsoleSessions.Session) async throws -> Response {
        let now = clock()
        let canAct = session.principal == .secret
        let endpoints = configuration.endpoints.filter { endpoint in session.principal.apps.map { $0.contains(endpoint.app) } ?? true }
        var rows: [[String]] = []
        var recoverForms = ""
        for endpoint in endpoints {
            let health = try await deliveryLog.health(endpoint: endpoint.id, now: now)
            let json = Self.endpointJSON(endpoint, health, now: now)
            func window(_ name: String) -> String {
                let window = json[name]
                let rate = HTML.percent(window?["successRate"]?.doubleValue)
                let p50 = window?["p50Ms"]?.int64Value.map { "\($0) ms" } ?? "–"
                let p99 = window?["p99Ms"]?.int64Value.map { "\($0) ms" } ?? "–"
                return "\(rate) of \(window?["attempts"]?.int64Value ?? 0)<br><span class=\"muted\">p50 \(p50) · p99 \(p99)</span>"
            }
            var state = Self.badge(json["circuit"]?.stringValue == "open" ? "open" : "closed")
            if json["disabled"]?.boolValue == true {
                state += " " + Self.badge("disabled")
                if canAct {
                    state += """
                         <form method="post" action="\(Self.consolePath)/actions/enable" class="inline"><input type="hidden" name="csrf" value="\(session.csrf)">\
                        <input type="hidden" name="endpoint" value="\(HTML.escape(endpoint.id))"><button type="submit" class="enable">Enable</button></form>
                        """
                }
            }
            if let paused = json["pausedUntil"]?.int64Value { state += " " + Self.badge("paused") + " <span class=\"muted\">until \(HTML.time(paused))</span>" }
            let failure = json["lastFailure"].flatMap { $0 == .null ? nil : $0 }
            rows.append([
                "<b>\(HTML.escape(endpoint.id))</b><br><span class=\"muted\">\(HTML.escape(endpoint.app)) · \(HTML.escape(json["host"]?.stringValue ?? ""))</span>",
                window("lastHour"), window("lastDay"), state,
                "\(health.retrying) retrying<br>\(health.dead) dead\(health.throttled > 0 ? "<br>\(health.throttled) throttled" : "")",
                failure.map { "\(HTML.time($0["finishedAt"]?.int64Value))<br><span class=\"wrap\">\(HTML.escape($0["error"]?.stringValue ?? ""))</span>" } ?? "–",
            ])
            if canAct {
                let dayAgo = String(Timestamp.rfc3339(milliseconds: now - 86_400_000).prefix(19)) + "Z"
                recoverForms += """
                    <form method="post" action="\(Self.consolePath)/actions/recover" class="filters recover"><input type="hidden" name="csrf" value="\(session.csrf)">
                    <input type="hidden" name="endpoint" value="\(HTML.escape(endpoint.id))"><strong>\(HTML.escape(endpoint.id))</strong>
                    <label>Since<input name="since" value="\(dayAgo)" required></label><label>Until (empty: now)<input name="until" value=""></label>
                    <button type="submit">Recover failures</button></form>
                    """
            }
        }
        var failures = DeliveryLog.Filter()
        if let apps = session.principal.apps { failures.apps = apps }
        failures.outcome = .dead
        let dead = try await deliveryLog.page(failures, before: nil, limit: 50).attempts
        failures.outcome = .retrying
        let retrying = try await deliveryLog.page(failures, before: nil, limit: 50).attempts
        var body = "<h2>Endpoints</h2>" + HTML.table(["endpoint", "last hour", "last day", "state", "backlog", "last failure"], rows, empty: "No endpoints configured.")
        if canAct, !recoverForms.isEmpty {
            body += "<h2>Recover a time range</h2><p class=\"muted\">Re-sends, once, each event whose attempt failed or died in the range and has not succeeded since.</p>" + recoverForms
        }
        let back = Self.consolePath + "/deliveries"
        body += "<h2>Dead letters</h2>" + attemptsTable(dead, session, back: back, empty: "No dead letters recorded.")
        body += "<h2>Waiting for a retry</h2>" + attemptsTable(retrying, session, back: back, empty: "Nothing is waiting for a retry.")
        let (notice, failed) = notice(request, session)
        return page("Deliveries", session, active: "deliveries", notice: notice, failed: failed, body: body)
    }

    // MARK: Rejected notifications

    /// How many of the newest rejected notifications the page counts.
    static let rejectedWindow = 1_000

    func rejectedPage(_ request: Request, _ session: ConsoleSessions.Session) async throws -> Response {
        guard let rejectedNotifications else {
            return page("Rejected notifications", session, active: "rejected", body: "<p class=\"muted\">This backend does not run next to the log, so it cannot read the rejected topic.</p>")
        }
        let recent: [RejectedNotification]
        do {
            recent = try await rejectedNotifications.recent(Self.rejectedWindow)
        } catch {
            return page("Rejected notifications", session, active: "rejected", status: .serviceUnavailable, body: "<p class=\"error\">The rejected topic could not be read: \(HTML.escape("\(error)"))</p>")
        }
        // A read key sees its apps' only (a notification for an unknown app belongs to none).
        let visible = recent.filter { notification in session.principal.apps.map { $0.contains(notification.app) } ?? true }
        let byReason = Dictionary(grouping: visible, by: \.reason).sorted { $0.value.count > $1.value.count || ($0.value.count == $1.value.count && $0.key < $1.key) }
        var body = "<p class=\"muted\">The newest \(Self.rejectedWindow) records of the rejected topic, by reason; <code>revenue-relay inspect</code> reads one in full.</p>"
        body += HTML.table(
            ["reason", "count", "stores", "apps", "latest"],
            byReason.map { reason, items in
                [
                    "<code id=\"reason-\(HTML.escape(reason))\">\(HTML.escape(reason))</code>", String(items.count),
                    HTML.escape(Set(items.map(\.store)).sorted().joined(separator: ", ")), HTML.escape(Set(items.map(\.app)).sorted().joined(separator: ", ")),
                    HTML.time(items.compactMap(\.receivedAt).max()),
                ]
            }, empty: "No rejected notifications.")
        for (reason, items) in byReason {
            body += "<h2>\(HTML.escape(reason))</h2>" + HTML.table(
                ["received", "store", "app", "detail", "position"],
                items.sorted { ($0.receivedAt ?? 0) > ($1.receivedAt ?? 0) }.prefix(5).map { item in
                    [HTML.time(item.receivedAt), HTML.escape(item.store), HTML.escape(item.app), "<span class=\"wrap\">\(HTML.escape(item.detail))</span>", "<code>\(HTML.escape(item.position))</code>"]
                })
        }
        return page("Rejected notifications", session, active: "rejected", body: body)
    }
}
