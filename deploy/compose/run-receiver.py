#!/usr/bin/env python3
"""Runs config/dev/receiver.py unchanged, but listening on every interface instead of 127.0.0.1, so the
deliverer can reach it from another container. RECEIVER_SCRIPT is its path (default /app/receiver.py,
where compose.yaml mounts it); the arguments (--port, --secret, --status) are passed on."""
import http.server
import os
import runpy
import sys


class AllInterfaces(http.server.ThreadingHTTPServer):
    def __init__(self, address, handler):
        super().__init__(("0.0.0.0", address[1]), handler)


# receiver.py runs `from http.server import ThreadingHTTPServer` when it starts, so it gets this one.
http.server.ThreadingHTTPServer = AllInterfaces
script = os.environ.get("RECEIVER_SCRIPT", "/app/receiver.py")
sys.argv = [script] + sys.argv[1:]
runpy.run_path(script, run_name="__main__")
