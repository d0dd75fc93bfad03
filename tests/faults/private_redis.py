"""What the faults tests that break Redis share: their own Redis deployments (never the
shared Redis), the small fleets they run on, the settings with short leases they use,
and a live system on them. The pytest fixtures over these are in ``conftest.py`` here
(``private_redis``, ``aof_redis``, ``sentinel_set``).

Used by ``test_outage.py``, ``test_role_change.py``, ``test_sigterm_bound.py`` and
``test_sentinel.py``; the Redis deployments themselves are the chaos runner's
(:mod:`bench.chaos_redis`), so the tests and the runner start Redis the same way.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from makespan.live import LiveSystem
from makespan.models import FleetSpec, load_fleet
from makespan.settings import Settings

TERMINAL = ("completed", "failed", "cancelled")

# two hosts of one GPU each, one simulated endpoint: a job per host, a worker per host
TWO_HOSTS = """
name = "faults"
[[hosts]]
name = "h1"
gpu_count = 1
memory_mib = 40000
[[hosts]]
name = "h2"
gpu_count = 1
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""

# one host of two GPUs (the Sentinel test: one GPU worker, two jobs at a time)
ONE_HOST = """
name = "faults-one-host"
[[hosts]]
name = "h1"
gpu_count = 2
memory_mib = 40000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 20000
cold_start_s = 10
evict_s = 1
"""


def fault_settings(redis_url: str, key_prefix: str, **overrides) -> Settings:
    """Settings of a live system under Redis faults: time scale 0.01, a 3 s lease TTL with
    a 0.5 s heartbeat, a fast planner tick, and Redis waits bounded at 2 s (socket) and
    1 s (connect), so a fault is noticed in seconds; ``overrides`` replace any field."""
    fields = dict(redis_url=redis_url, key_prefix=key_prefix, time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
                  batch_wait_s=0.02, planner_tick_s=0.05, redis_socket_timeout_s=2.0, redis_connect_timeout_s=1.0)
    return Settings(**{**fields, **overrides})


def write_fleet(tmp_path: Path, text: str = TWO_HOSTS) -> tuple[Path, FleetSpec]:
    """The fleet file ``tmp_path/fleet.toml`` with ``text``; (its path, the loaded fleet)."""
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path, load_fleet(path)


@contextlib.contextmanager
def live_system(tmp_path: Path, settings: Settings, fleet_text: str = TWO_HOSTS, planners: int = 1,
                observer: bool = True) -> Iterator[tuple[LiveSystem, FleetSpec]]:
    """A started live system (planners, a GPU worker per host, the observer) as real
    processes on ``settings``, logs under ``tmp_path/logs``; stopped on exit."""
    path, fleet = write_fleet(tmp_path, fleet_text)
    system = LiveSystem(path, fleet, settings, tmp_path / "logs", planners=planners, observer=observer)
    try:
        system.start()  # inside: a start that fails (a worker died) leaves no process running
        yield system, fleet
    finally:
        system.stop()


def process_logs(system: LiveSystem, tail_chars: int = 3000) -> dict[str, str]:
    """The last ``tail_chars`` characters of each process's log (for a failure message)."""
    return {p.name: p.log_path.read_text(errors="replace")[-tail_chars:] for p in system.procs}


def completion_server(answer: Callable[[dict], str]) -> ThreadingHTTPServer:
    """A local HTTP server (started, on a free port) answering every POST with a
    completion ``{"choices": [{"text": answer(body)}]}``; ``answer`` gets the request's JSON
    body and may block or act on the test's Redis first. Call ``shutdown()`` when done."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            data = json.dumps({"choices": [{"text": answer(body)}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def tls_files(d: Path) -> dict[str, str]:
    """A test CA and a server certificate for 127.0.0.1 signed by it (openssl), in ``d``: the
    paths as ``{"ca", "cert", "key"}``."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=makespan-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.crt", "-days", "2", "-extfile", "ext.cnf")
    return {k: str(d / f) for k, f in (("ca", "ca.crt"), ("cert", "server.crt"), ("key", "server.key"))}

