import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayTestSupport
import Synchronization
import Testing

/// The console in a real browser (Debian's headless Chromium through chromedriver) against a whole relay:
/// sign in, see the overview's charts drawn, open a customer, resend a dead-lettered delivery and see it
/// arrive at a local receiver; a read key's session offers no actions; the page fits a phone's width.
/// A failing step writes a screenshot and names its path. With `RELAY_CONSOLE_SCREENSHOT=<file.png>` the
/// overview is also saved there (the README's picture is made so).
@Suite(.serialized) struct ConsoleBrowserTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    @Test func signInSeeTheChartsOpenACustomerAndResendADeadLetter() async throws {
        let accepting = Atomic<Bool>(false)
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: accepting.load(ordering: .relaxed) ? 200 : 500) }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-console"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        try StripeDemoConfiguration.write(
            to: file,
            backend: #"apiKey: "sk_console_secret_0001", database: backend.sqlite, listen: "127.0.0.1:0", readKeys: [{ key: "rk_console_read_0002", apps: [demo] }]"#,
            endpoints: [#"id: hooks, app: demo, url: "\#(receiver.baseURL)/hooks", secrets: ["\#(Self.secret)"], events: ["*"]"#])
        let relay = try await TestRelay(configuration: try RelayConfiguration.load(path: file.path, environment: [:]), log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()

        // Eight customers bought over the last four weeks (production), and the endpoint fails: sixteen
        // webhooks dead-lettered.
        let now = Int64(Date().timeIntervalSince1970)
        let purchases = [(25, 999), (21, 1999), (17, 4999), (14, 999), (10, 1999), (7, 999), (3, 4999), (1, 1999)]
        for (index, (daysAgo, cents)) in purchases.enumerated() {
            let body = StripeTestEvent.subscriptionCreated(
                subscription: "sub_\(index)", event: "evt_console_\(index)", user: "user-\(index)", cents: Int64(cents),
                start: now - Int64(daysAgo) * 86_400 - 60, livemode: true)
            #expect(try await relay.postStripe(body) == 200)
        }
        // And one forged notification, which the worker rejects.
        let forged = #"{"id": "evt_forged", "object": "event", "type": "customer.subscription.created", "livemode": true, "data": {"object": {}}}"#
        let forgedStatus = try await relay.post(
            "/v1/notifications/stripe/demo", body: forged, headers: [("Stripe-Signature", "t=\(now),v1=\(String(repeating: "ab", count: 32))")]).status
        #expect(forgedStatus == 200, "the ingest stores it; the worker verifies")
        let (rejectedReader, rejectedRecords) = try relay.reader(topic: "relay.notifications.rejected")
        try await rejectedRecords.waitFor(count: 1)
        await rejectedReader.close()
        try await waitUntil("sixteen dead letters in the delivery log") {
            let dead = try await relay.backend("/subscriptions-api/internal/v1/deliveries?status=dead&limit=100", key: "sk_console_secret_0001")
            return dead.json["deliveries"]?.arrayValue?.count == 16
        }
        #expect(receiver.requests.count == 32)

        let browser = try await WebDriver(name: "console")
        do {
            // Sign in with the secret key: the overview with its charts drawn.
            try await browser.open(backendURL + "/console")
            try await browser.type("#key", "sk_console_secret_0001")
            try await browser.click("#sign-in")
            _ = try await browser.element("#chart-mrr svg polyline")
            await browser.check(try await browser.text("#card-mrr").contains("$189.92"), "MRR is the eight monthly prices")
            await browser.check(try await browser.text("#card-active").hasPrefix("8"), "eight active subscriptions")
            // The MRR line rises with each purchase: its first point (four weeks ago) is higher on the page than its last.
            let points = try await browser.evaluate("return document.querySelector('#chart-mrr polyline').getAttribute('points')").stringValue ?? ""
            let heights = points.split(separator: " ").compactMap { $0.split(separator: ",").last.flatMap { Double($0) } }
            await browser.check(heights.count == 30 && (heights.first ?? 0) > (heights.last ?? 0), "MRR rises over the 30 days: \(points)")
            await browser.check(try await browser.count("figure.chart svg") == 4, "four charts")
            await browser.check(try await browser.count("#chart-net svg rect") >= 1, "net revenue bars")
            let html = try await browser.evaluate("return document.documentElement.outerHTML").stringValue ?? ""
            await browser.check(!html.contains("<script"), "no script on the page")
            if let path = ProcessInfo.processInfo.environment["RELAY_CONSOLE_SCREENSHOT"] {
                try await browser.resize(width: 1280, height: 1400)
                try await browser.open(backendURL + "/console")
                _ = try await browser.element("#chart-mrr svg polyline")
                try (try await browser.screenshot()).write(to: URL(fileURLWithPath: path))
            }

            // A customer: their timeline and the webhooks sent about them.
            try await browser.open(backendURL + "/console/customers")
            try await browser.type("#customer-id", "user-1")
            try await browser.click("#look-up")
            var customer = ""
            try await browser.waitFor("the customer's timeline") {
                customer = try await browser.text("main")
                return customer.contains("initial_purchase")
            }
            await browser.check(customer.contains("sub_1") && customer.contains("pro · active"), "the subscription and its entitlement")
            await browser.check(customer.contains("stripe:evt_console_1:initial_purchase") && customer.contains("dead"), "the webhooks and their status")

            // The endpoint is fixed: resend one dead letter from the deliveries page, and it arrives.
            accepting.store(true, ordering: .relaxed)
            try await browser.open(backendURL + "/console/deliveries")
            let event = try #require(try await browser.evaluate("return document.querySelector('button.resend').dataset.id").stringValue)
            try await browser.click("button.resend")
            try await browser.waitFor("the notice") { try await browser.text("main").contains("Re-sent") }
            try await waitUntil("the resent webhook") { receiver.requests.count == 33 }
            let sent = try #require(receiver.requests.last)
            await browser.check(event.contains(sent.headers["webhook-id"] ?? "-"), "the resent delivery carries its event's webhook-id")
            await browser.check(StandardWebhooksReceiver.verify(sent, secret: Self.secret), "signed")

            // The rejected notification, counted by its reason, with its detail and never its payload.
            try await browser.open(backendURL + "/console/rejected")
            var rejected = ""
            try await browser.waitFor("the rejected notification") {
                rejected = try await browser.text("main")
                return rejected.contains("bad_signature")
            }
            await browser.check(rejected.contains("relay.notifications.rejected:") && !rejected.contains("evt_forged"), "its position, not its payload")

            // A read key's session sees the deliveries and offers no action.
            try await browser.deleteCookies()
            try await browser.open(backendURL + "/console")
            try await browser.type("#key", "rk_console_read_0002")
            try await browser.click("#sign-in")
            _ = try await browser.element("#chart-mrr")
            try await browser.open(backendURL + "/console/deliveries")
            _ = try await browser.element("table")
            let buttons = try await browser.count("button.resend") + (try await browser.count("form.recover"))
            await browser.check(buttons == 0, "a read key cannot act")
            await browser.check(try await browser.text("header").contains("read key"), "the session says which key")

            // A phone's width: nothing wider than the screen but the tables, which scroll in their box.
            try await browser.resize(width: 390, height: 844)
            for page in ["/console", "/console/deliveries"] {
                try await browser.open(backendURL + page)
                let fits = try await browser.evaluate("return document.documentElement.scrollWidth <= window.innerWidth + 1").boolValue == true
                await browser.check(fits, "\(page) fits a phone's width")
            }
        } catch {
            await browser.quit()
            throw error
        }
        await browser.quit()
        try await relay.stop()
        await receiver.stop()
    }
}
