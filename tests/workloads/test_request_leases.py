"""Request leases (ctx.requests' sender, workers/requests.py) against a real HTTP server that
counts the requests in flight; two cases a review found (2026-12-04):

* a request lease outlives its request: it lived 30 s, nothing renewed it, and the default
  request timeout is 60 s, so a long generation lost its lease while still running and
  another sender took the slot past the endpoint's cap;
* a request that cannot be sent (a body JSON cannot encode) leaves no lease behind: the
  others were cancelled at the event loop's end, when their releases no longer reached
  Redis, and the leases held the endpoint's slots until they expired."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from makespan.workers import requests as requests_module
from makespan.workers.requests import RequestRunner, request_drain


class _CountingServer:
    """An OpenAI-style completions server that answers after ``latency_s`` and counts the
    requests in flight at once (``peak``)."""

    def __init__(self, latency_s: float):
        self.latency_s, self.lock, self.in_flight, self.peak = latency_s, threading.Lock(), 0, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with server.lock:
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                try:
                    time.sleep(server.latency_s)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                data = json.dumps({"object": "text_completion", "model": body.get("model"),
                                   "choices": [{"index": 0, "text": "ok"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    started = _CountingServer(latency_s=getattr(request, "param", 1.0))
    yield started
    started.stop()


def test_the_cap_holds_for_a_request_that_runs_longer_than_the_lease_margin(r, keys, server, monkeypatch):
    monkeypatch.setattr(requests_module, "REQUEST_LEASE_TTL_S", 0.3)
    out = {}

    def send(job_id):
        out[job_id] = RequestRunner(r, keys, "instance-1", server.url, "m", 1).run(
            job_id, {"items": ["long generation"], "request_timeout_s": 30.0})

    senders = [threading.Thread(target=send, args=(job_id,)) for job_id in ("a", "b")]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    assert out["a"].ok == out["b"].ok == 1
    assert server.peak == 1, f"{server.peak} requests in flight at the endpoint, cap 1"
    assert request_drain(r, keys, ["instance-1"]) == {"request_leases": 0, "waiters": 0}


@pytest.mark.parametrize("server", [0.05], indirect=True)
@pytest.mark.parametrize("repeat", range(8))  # the old leak showed in about one run in four
def test_a_request_that_cannot_be_sent_fails_the_step_and_leaves_no_lease(r, keys, server, repeat):
    items = [{"prompt": "x", "bad": {1, 2}}] + [f"p{k}" for k in range(30)]
    with pytest.raises(TypeError):
        RequestRunner(r, keys, "instance-2", server.url, "m", 2).run("job", {"items": items})
    assert request_drain(r, keys, ["instance-2"]) == {"request_leases": 0, "waiters": 0}
    assert server.peak <= 2
