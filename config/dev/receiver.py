#!/usr/bin/env python3
"""A webhook receiver for trying `revenue-relay dev`: listens on 127.0.0.1:8090 and verifies each
webhook with the `standardwebhooks` and `svix` libraries when the Python running it has them, else with
the same algorithm from the standard library. Debian's system Python refuses `pip install` (externally
managed), so put them in a virtual environment (apt-get install -y python3-venv, if venv is missing):

    python3 -m venv /tmp/sw && /tmp/sw/bin/pip install standardwebhooks svix
    /tmp/sw/bin/python config/dev/receiver.py [--port 8090] [--secret whsec_...] [--status 200]

--status 500 makes every delivery fail (watch the retries, then the dead-letter topic).
"""
import argparse, base64, hashlib, hmac, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The server answers each webhook on its own thread: one lock and one write per line, so concurrent
# deliveries never interleave their lines.
OUTPUT = threading.Lock()

def say(line):
    with OUTPUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

DEV_SECRET = "whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtMDEyMzQ1Njc4OQ=="

def verify_stdlib(secret, body, headers):
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, ts, sigs = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    if abs(time.time() - int(ts)) > 300:
        raise ValueError("timestamp outside the tolerance")
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    if not any(s.split(",", 1) == ["v1", expected] for s in sigs.split(" ")):
        raise ValueError("no matching signature")

def verifiers(secret):
    found = []
    try:
        from standardwebhooks.webhooks import Webhook as StandardWebhook
        found.append(("standardwebhooks", lambda body, headers: StandardWebhook(secret).verify(body, headers)))
    except ImportError:
        pass
    try:
        from svix.webhooks import Webhook as SvixWebhook
        svix_headers = lambda h: {"svix-id": h["svix-id"], "svix-timestamp": h["svix-timestamp"], "svix-signature": h["svix-signature"]}
        found.append(("svix", lambda body, headers: SvixWebhook(secret).verify(body, svix_headers(headers))))
    except ImportError:
        pass
    return found or [("stdlib", lambda body, headers: verify_stdlib(secret, body, headers))]

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--secret", default=DEV_SECRET)
    parser.add_argument("--status", type=int, default=200)
    options = parser.parse_args()
    checks = verifiers(options.secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            results = []
            for name, check in checks:
                try:
                    check(body, headers)
                    results.append(f"{name}: verified")
                except Exception as error:  # noqa: BLE001 - show whatever the library says
                    results.append(f"{name}: FAILED ({error})")
            event = json.loads(body)
            say(f"{headers.get('webhook-id')}  {event.get('type')}  {'; '.join(results)}  -> {options.status}")
            self.send_response(options.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    say(f"receiving on http://127.0.0.1:{options.port}/webhooks ({', '.join(n for n, _ in checks)})")
    ThreadingHTTPServer(("127.0.0.1", options.port), Handler).serve_forever()

if __name__ == "__main__":
    main()
