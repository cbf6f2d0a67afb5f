#!/usr/bin/env python3
"""A stand-in for Stripe's API, for trying web checkout with `revenue-relay dev` without a Stripe account:
listens on 127.0.0.1:8091, where config/dev.yaml's `web` app points `stripe.api.baseUrl`, and answers the
calls the relay makes (a price, creating and reading Checkout Sessions, reading subscriptions) as Stripe
does. Opening a session's checkout URL (http://127.0.0.1:8091/pay/<id>) is the buyer paying: the session
completes, its subscription is made, and Stripe's signed `customer.subscription.created` webhook is sent
to the relay's ingest. Development only; standard library only.

    python3 config/dev/fake-stripe.py [--port 8091] [--ingest http://127.0.0.1:8080]
"""
import argparse, hashlib, hmac, json, sys, threading, time, urllib.parse, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "sk_test_dev_only_fake_stripe"
WEBHOOK_SECRET = "whsec_dev_only_web_secret"
PRICES = {"price_dev_web_pro": {"id": "price_dev_web_pro", "object": "price", "type": "recurring", "unit_amount": 999,
                                "currency": "usd", "product": "prod_dev_web", "recurring": {"interval": "month", "interval_count": 1}}}
LOCK = threading.Lock()
SESSIONS, SUBSCRIPTIONS, KEYS = {}, {}, {}

def metadata(form, prefix):
    """Stripe's form encoding: `prefix[key]` → {key: value}."""
    return {k[len(prefix) + 1:-1]: v for k, v in form.items() if k.startswith(prefix + "[") and "[" not in k[len(prefix) + 1:]}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        if self.headers.get("Authorization") != "Bearer " + API_KEY:
            self.reply(401, {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided"}})
            return False
        return True

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path.startswith("/pay/"):
            return self.pay(path[len("/pay/"):])
        if path == "/success":
            return self.reply(200, {"paid": True, "next": "POST checkout/session/complete with the checkoutContextId for the redemption link"})
        if not self.authorized():
            return
        with LOCK:
            found = (PRICES.get(path[len("/v1/prices/"):]) if path.startswith("/v1/prices/") else
                     SESSIONS.get(path[len("/v1/checkout/sessions/"):]) if path.startswith("/v1/checkout/sessions/") else
                     SUBSCRIPTIONS.get(path[len("/v1/subscriptions/"):]) if path.startswith("/v1/subscriptions/") else None)
        if found is None:
            return self.reply(404, {"error": {"type": "invalid_request_error", "code": "resource_missing"}})
        self.reply(200, found)

    def do_POST(self):
        if self.path != "/v1/checkout/sessions" or not self.authorized():
            if self.path != "/v1/checkout/sessions":
                self.reply(404, {"error": {"type": "invalid_request_error"}})
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        form = dict(urllib.parse.parse_qsl(body, keep_blank_values=True))
        key = self.headers.get("Idempotency-Key", "")
        with LOCK:
            if key in KEYS:  # Stripe answers a repeated key with the first session
                return self.reply(200, SESSIONS[KEYS[key]])
            sid = "cs_test_dev%04d" % (len(SESSIONS) + 1)
            KEYS[key] = sid
            SESSIONS[sid] = {"id": sid, "object": "checkout.session", "status": "open", "payment_status": "unpaid", "mode": form.get("mode"),
                             "url": "http://127.0.0.1:%d/pay/%s" % (self.server.server_port, sid), "livemode": False,
                             "metadata": metadata(form, "metadata"), "subscription": None, "customer": None, "price": form.get("line_items[0][price]"),
                             "subscription_metadata": metadata(form, "subscription_data[metadata]")}
            session = SESSIONS[sid]
        print("checkout session %s created for %s" % (sid, form.get("line_items[0][price]")), flush=True)
        self.reply(200, session)

    def pay(self, sid):
        with LOCK:
            session = SESSIONS.get(sid)
            if session is None:
                return self.reply(404, {"error": "no such session"})
            sub_id = "sub_dev" + sid[len("cs_test_dev"):]
            now = int(time.time())
            price = PRICES[session["price"]]
            subscription = {"id": sub_id, "object": "subscription", "status": "active", "customer": "cus_dev_buyer", "livemode": False,
                            "start_date": now, "current_period_start": now, "current_period_end": now + 30 * 86400, "latest_invoice": "in_dev" + sid[-4:],
                            "cancel_at_period_end": False, "metadata": session["subscription_metadata"],
                            "items": {"object": "list", "data": [{"id": "si_dev", "quantity": 1, "price": price}]}}
            SUBSCRIPTIONS[sub_id] = subscription
            session.update(status="complete", payment_status="paid", customer="cus_dev_buyer", subscription=sub_id,
                           customer_details={"email": "buyer@example.com"})
        event = json.dumps({"id": "evt_dev_" + sid, "object": "event", "type": "customer.subscription.created", "created": now,
                            "livemode": False, "data": {"object": subscription}}).encode()
        signature = hmac.new(WEBHOOK_SECRET.encode(), b"%d." % now + event, hashlib.sha256).hexdigest()
        request = urllib.request.Request(self.server.ingest + "/v1/notifications/stripe/web", data=event, method="POST",
                                         headers={"Content-Type": "application/json", "Stripe-Signature": "t=%d,v1=%s" % (now, signature)})
        with urllib.request.urlopen(request) as answer:
            status = answer.status
        print("paid %s: subscription %s, webhook customer.subscription.created -> ingest %d" % (sid, sub_id, status), flush=True)
        self.send_response(303)
        self.send_header("Location", "/success?session=" + sid)
        self.end_headers()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--ingest", default="http://127.0.0.1:8080")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.ingest = args.ingest.rstrip("/")
    print("fake Stripe API on http://127.0.0.1:%d (checkout URLs pay when opened)" % args.port, flush=True)
    server.serve_forever()
