"""A small real endpoint program: an OpenAI-compatible model server stand-in.

``python -m makespan.workers.endpoint_server --port P --load-time-s T --latency-ms L --model NAME``

Routes (stdlib :mod:`http.server`, one thread per request):

* ``GET /health``: 503 ``{"status": "loading"}`` for ``--load-time-s`` seconds after
  start, then 200 ``{"status": "ok", "cuda_visible_devices": ..., "children": [pids]}`` (the GPUs it was
  launched on, as the driver set them; vLLM answers 200 while asleep too).
* ``POST /v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings``: after
  ``--latency-ms`` a valid OpenAI-shaped response (``text_completion`` /
  ``chat.completion`` / a ``list`` of 8-dimensional ``embedding`` vectors, ``usage``); 503 while loading or asleep; 400 on a body that is not JSON.
* vLLM's sleep mode: ``POST /sleep[?level=1]``, ``POST /wake_up``, ``GET /is_sleeping``
  (``{"is_sleeping": bool}``).
* ``GET /v1/models``, ``GET /metrics`` (Prometheus text: requests served).
* ``--hold-gpu-mib N``: allocate N MiB on each visible GPU before serving (torch), as a
  model server holds its weights; real-GPU tests watch NVML memory with it.

SIGTERM stops it cleanly (exit 0) unless ``--ignore-sigterm`` is given (tests use that
to check a driver's SIGKILL escalation). ``--spawn-child-ignoring-sigterm N`` starts N
child processes in its process group that ignore SIGTERM and run until killed, as a
model server's engine and tensor-parallel workers can outlive their API server; their
pids are in ``/health`` (``children``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse


class EndpointState:
    """Mutable server state shared by request threads."""

    def __init__(self, model: str, load_time_s: float, latency_ms: float, gpus: str):
        self.model = model
        self.ready_at = time.monotonic() + load_time_s
        self.latency_s = latency_ms / 1000.0
        self.gpus = gpus
        self.sleeping = False
        self.served = 0
        self.children: list[int] = []  # pids of --spawn-child-ignoring-sigterm children
        self.lock = threading.Lock()

    @property
    def loading(self) -> bool:
        return time.monotonic() < self.ready_at


def _handler(state: EndpointState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY: headers and body go out in two writes; with Nagle on, the body
        # waits for the client's delayed ACK of the headers (~40 ms per request).
        disable_nagle_algorithm = True

        def log_message(self, fmt: str, *args) -> None:  # one line per request on stderr
            sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

        def _send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict | None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b"{}"
            try:
                data = json.loads(raw or b"{}")
            except ValueError:
                return None
            return data if isinstance(data, dict) else None

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = urlparse(self.path).path
            if path == "/health":
                if state.loading:
                    self._send(503, {"status": "loading"})
                else:
                    self._send(200, {"status": "ok", "cuda_visible_devices": state.gpus,
                                     "children": state.children})
            elif path == "/is_sleeping":
                self._send(200, {"is_sleeping": state.sleeping})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": state.model, "object": "model"}]})
            elif path == "/metrics":
                self._send(200, f"endpoint_requests_total {state.served}\n"
                                f"endpoint_sleeping {int(state.sleeping)}\n", "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            path = urlparse(self.path).path
            body = self._body()
            if path == "/sleep":
                state.sleeping = True
                self._send(200, {"is_sleeping": True})
            elif path == "/wake_up":
                state.sleeping = False
                self._send(200, {"is_sleeping": False})
            elif path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
                if state.loading or state.sleeping:
                    self._send(503, {"error": "loading" if state.loading else "sleeping"})
                    return
                if body is None:
                    self._send(400, {"error": "body must be a JSON object"})
                    return
                time.sleep(state.latency_s)
                with state.lock:
                    state.served += 1
                    n = state.served
                self._send(200, _completion(path, state.model, body, n))
            else:
                self._send(404, {"error": "not found"})

    return Handler


def _completion(path: str, model: str, body: dict, n: int) -> dict:
    created = int(time.time())
    usage = {"prompt_tokens": 8, "completion_tokens": 8, "total_tokens": 16}
    if path.endswith("embeddings"):
        inputs = body.get("input", "")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        return {"object": "list", "model": body.get("model", model),
                "usage": {"prompt_tokens": 8 * len(inputs), "total_tokens": 8 * len(inputs)},
                "data": [{"object": "embedding", "index": i,
                          "embedding": [((hash(str(x)) >> k) & 0xFF) / 255.0 for k in range(0, 64, 8)]}
                         for i, x in enumerate(inputs)]}
    if path.endswith("chat/completions"):
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": created,
                "model": body.get("model", model), "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"reply {n} from {model}"}}]}
    return {"id": f"cmpl-{n}", "object": "text_completion", "created": created,
            "model": body.get("model", model), "usage": usage,
            "choices": [{"index": 0, "text": f"completion {n} from {model}", "finish_reason": "stop",
                         "logprobs": None}]}


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a client opening more connections at
    # once (a step with slots > 5) loses SYNs and waits out the 1 s retransmission.
    request_queue_size = 128


def hold_gpu_memory(mib: int) -> object | None:
    """Allocate ``mib`` MiB on each visible CUDA device (torch), like a model server
    loading its weights; returns the tensors (keep them alive) or None without torch or
    CUDA. Used by real-GPU tests to see evictions free memory through NVML."""
    if mib <= 0:
        return None
    try:
        import torch
    except ImportError:
        sys.stderr.write("endpoint_server: --hold-gpu-mib ignored (no torch)\n")
        return None
    if not torch.cuda.is_available():
        sys.stderr.write("endpoint_server: --hold-gpu-mib ignored (no CUDA device visible)\n")
        return None
    held = []
    for d in range(torch.cuda.device_count()):
        held.append(torch.ones(mib << 20, dtype=torch.uint8, device=f"cuda:{d}"))
    torch.cuda.synchronize()
    return held


# A child that ignores SIGTERM and runs until SIGKILL (it stays in its parent's process group).
_STUBBORN_CHILD = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdout.close()\n"
                   "while True: time.sleep(3600)\n")


def spawn_stubborn_children(n: int) -> list[int]:
    """Start ``n`` children that ignore SIGTERM (in this process group) and wait until
    each one ignores it (before the server answers healthy); their pids."""
    import subprocess

    pids = []
    for _ in range(n):
        child = subprocess.Popen([sys.executable, "-c", _STUBBORN_CHILD], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE)
        child.stdout.readline()  # 'ready': SIGTERM is ignored from now on
        child.stdout.close()
        pids.append(child.pid)
    return pids


def serve(port: int, model: str = "stub", load_time_s: float = 0.0, latency_ms: float = 0.0,
          host: str = "127.0.0.1", ignore_sigterm: bool = False, hold_gpu_mib: int = 0,
          children_ignoring_sigterm: int = 0) -> None:
    """Run the server until SIGTERM/SIGINT (blocking). With ``hold_gpu_mib`` it first
    allocates that much memory on each visible GPU (:func:`hold_gpu_memory`); with
    ``children_ignoring_sigterm`` it starts that many children that ignore SIGTERM
    (:func:`spawn_stubborn_children`)."""
    import os

    weights = hold_gpu_memory(hold_gpu_mib)  # noqa: F841 (held until exit)
    children = spawn_stubborn_children(children_ignoring_sigterm)
    state = EndpointState(model, load_time_s, latency_ms, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    state.children = children
    httpd = _Server((host, port), _handler(state))
    httpd.daemon_threads = True

    def _stop(signum, frame) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else _stop)
    signal.signal(signal.SIGINT, _stop)
    sys.stderr.write(f"endpoint_server model={model} port={port} load_time_s={load_time_s} "
                     f"CUDA_VISIBLE_DEVICES={state.gpus}\n")
    sys.stderr.flush()
    try:
        httpd.serve_forever(poll_interval=0.1)
    finally:
        httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="endpoint_server", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="stub")
    p.add_argument("--load-time-s", type=float, default=0.0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--spawn-child-ignoring-sigterm", type=int, default=0, metavar="N",
                   help="start N child processes that ignore SIGTERM (they outlive this server)")
    p.add_argument("--hold-gpu-mib", type=int, default=0,
                   help="allocate this much memory (MiB) on each visible GPU at start (needs torch)")
    a = p.parse_args(argv)
    serve(a.port, a.model, a.load_time_s, a.latency_ms, a.host, a.ignore_sigterm, a.hold_gpu_mib,
          a.spawn_child_ignoring_sigterm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
