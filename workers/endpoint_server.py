"""A small real endpoint program: an OpenAI-compatible model server stand-in.

``python -m makespan.workers.endpoint_server --port P --load-time-s T --latency-ms L --model NAME``

Routes (stdlib :mod:`http.server`, one thread per request):

* ``GET /health``: 503 ``{"status": "loading"}`` for ``--load-time-s`` seconds after
  start, then 200 ``{"status": "ok", "cuda_visible_devices": ..., "children": [pids]}`` (the GPUs it was
  launched on, as the driver set them; vLLM answers 200 while asleep too).
* ``POST /v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings``: after
  ``--latency-ms`` a valid OpenAI-shaped response (``text_completion`` /
  ``chat.completion`` / a ``list`` of 8-dimensional ``embedding`` vectors, ``usage``); 503 while loading or asleep; 400 on a body that is not JSON.
* vLLM's sleep mode (vLLM docs, "Sleep Mode"; routes of ``vllm serve`` under
  ``VLLM_SERVER_DEV_MODE=1``): ``POST /sleep?level=N`` (1 by default), ``POST /wake_up``,
  ``GET /is_sleeping`` (``{"is_sleeping": bool}``). Both levels are emulated: a sleep
  takes ``--sleep-s`` and releases the GPU memory held with ``--hold-gpu-mib``; level 1
  also holds ``--sleep-ram-mib`` MiB of host RAM (a bytearray, as vLLM keeps the weights
  in CPU memory), level 2 holds none. A wake takes ``--wake-s`` (from level 2:
  ``--wake-level2-s`` when given, as vLLM reloads the dropped weights), re-allocates the GPU
  memory and frees the RAM. ``--fail-wake`` makes every wake answer 500 (tests of the
  worker's fallback to a cold start). ``/health`` answers 200 while asleep, as vLLM's does.
* ``GET /v1/models``, ``GET /metrics`` (Prometheus text: requests served, sleeping,
  sleep level, host RAM held asleep in MiB, ``endpoint_gpu_memory_mib``: the MiB per GPU
  it holds by its own accounting — ``--hold-gpu-mib`` awake, 0 asleep — and
  ``endpoint_gpu_memory_allocated``: 1 when torch really allocated it on a GPU, 0 when
  the figure is the CPU-only emulation's).
* ``--hold-gpu-mib N``: allocate N MiB on each visible GPU before serving (torch), as a
  model server holds its weights; real-GPU tests watch NVML memory with it.
* vLLM's command line is accepted too: ``endpoint_server serve MODEL --port P
  [--tensor-parallel-size N --enable-sleep-mode ...]`` (unknown vLLM flags are ignored),
  so the ``vllm`` driver preset can run it as its executable.

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
from urllib.parse import parse_qs, urlparse


class EndpointState:
    """Mutable server state shared by request threads."""

    def __init__(self, model: str, load_time_s: float, latency_ms: float, gpus: str):
        self.model = model
        self.ready_at = time.monotonic() + load_time_s
        self.latency_s = latency_ms / 1000.0
        self.gpus = gpus
        self.sleeping = False
        self.sleep_level = 0  # 0 awake, else the level it sleeps at
        self.sleep_s = 0.0
        self.wake_s = 0.0
        self.wake_level2_s: float | None = None  # None: a level-2 wake takes wake_s too
        self.sleep_ram_mib = 0
        self.fail_wake = False
        self.hold_gpu_mib = 0
        self.gpu_memory: object | None = None  # tensors held on the GPUs (hold_gpu_memory)
        self.gpu_mib_held = 0  # MiB per GPU held by its own accounting (emulated without torch)
        self.host_ram: bytearray | None = None  # level-1 sleeper's "weights" in host RAM
        self.transition_lock = threading.Lock()  # one sleep or wake at a time
        self.served = 0
        self.children: list[int] = []  # pids of --spawn-child-ignoring-sigterm children
        self.lock = threading.Lock()

    @property
    def loading(self) -> bool:
        return time.monotonic() < self.ready_at

    def sleep(self, level: int) -> None:
        """Go to sleep at ``level`` (1 or 2), taking ``sleep_s``: the GPU memory is released;
        level 1 keeps ``sleep_ram_mib`` MiB of host RAM. Asleep already: nothing changes."""
        with self.transition_lock:
            if self.sleeping:
                return
            time.sleep(self.sleep_s)
            self.gpu_memory = None
            release_gpu_memory()
            self.gpu_mib_held = 0
            if level == 1 and self.sleep_ram_mib > 0:
                self.host_ram = bytearray(self.sleep_ram_mib << 20)  # zero-filled: the pages are touched
            self.sleeping, self.sleep_level = True, level

    def wake(self) -> bool:
        """Wake, taking ``wake_s`` (from level 2: ``wake_level2_s`` when set): GPU memory
        allocated again, host RAM freed. False (still asleep) with ``fail_wake``."""
        with self.transition_lock:
            if not self.sleeping:
                return True
            level2 = self.sleep_level == 2 and self.wake_level2_s is not None
            time.sleep(self.wake_level2_s if level2 else self.wake_s)
            if self.fail_wake:
                return False
            self.gpu_memory = hold_gpu_memory(self.hold_gpu_mib)
            self.gpu_mib_held = self.hold_gpu_mib
            self.host_ram = None
            self.sleeping, self.sleep_level = False, 0
            return True


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
                ram = len(state.host_ram) >> 20 if state.host_ram is not None else 0
                self._send(200, f"endpoint_requests_total {state.served}\n"
                                f"endpoint_sleeping {int(state.sleeping)}\n"
                                f"endpoint_sleep_level {state.sleep_level}\n"
                                f"endpoint_sleep_ram_mib {ram}\n"
                                f"endpoint_gpu_memory_mib {state.gpu_mib_held}\n"
                                f"endpoint_gpu_memory_allocated {int(state.gpu_memory is not None)}\n", "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            path = url.path
            body = self._body()
            if path == "/sleep":
                level = parse_qs(url.query).get("level", ["1"])[0]
                if level not in ("1", "2"):
                    self._send(400, {"error": f"sleep level must be 1 or 2, got {level!r}"})
                    return
                state.sleep(int(level))
                self._send(200, {"is_sleeping": True})
            elif path == "/wake_up":
                if not state.wake():
                    self._send(500, {"error": "wake failed (--fail-wake)"})
                    return
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


def release_gpu_memory() -> None:
    """Return the CUDA caching allocator's free blocks to the driver (after the tensors of
    :func:`hold_gpu_memory` are dropped), so NVML sees the memory released; no-op without
    torch or CUDA."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


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
          children_ignoring_sigterm: int = 0, sleep_s: float = 0.0, wake_s: float = 0.0,
          sleep_ram_mib: int = 0, fail_wake: bool = False, wake_level2_s: float | None = None) -> None:
    """Run the server until SIGTERM/SIGINT (blocking). With ``hold_gpu_mib`` it first
    allocates that much memory on each visible GPU (:func:`hold_gpu_memory`); with
    ``children_ignoring_sigterm`` it starts that many children that ignore SIGTERM
    (:func:`spawn_stubborn_children`). ``sleep_s``/``wake_s``/``wake_level2_s`` (wall s;
    ``wake_level2_s`` None: a level-2 wake takes ``wake_s``), ``sleep_ram_mib`` and
    ``fail_wake``: the sleep-mode emulation (module doc)."""
    import os

    children = spawn_stubborn_children(children_ignoring_sigterm)
    state = EndpointState(model, load_time_s, latency_ms, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    state.gpu_memory = hold_gpu_memory(hold_gpu_mib)  # held until exit or sleep
    state.hold_gpu_mib, state.sleep_s, state.wake_s = hold_gpu_mib, sleep_s, wake_s
    state.gpu_mib_held = hold_gpu_mib
    state.sleep_ram_mib, state.fail_wake = sleep_ram_mib, fail_wake
    state.wake_level2_s = wake_level2_s
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
    p.add_argument("--sleep-s", type=float, default=0.0, help="wall seconds a POST /sleep takes")
    p.add_argument("--wake-s", type=float, default=0.0, help="wall seconds a POST /wake_up takes")
    p.add_argument("--wake-level2-s", type=float, default=None,
                   help="wall seconds a POST /wake_up from sleep level 2 takes (default: --wake-s)")
    p.add_argument("--sleep-ram-mib", type=int, default=0,
                   help="host RAM (MiB) a level-1 sleeper holds (its weights offloaded to CPU memory)")
    p.add_argument("--fail-wake", action="store_true", help="every POST /wake_up answers 500")
    args = list(sys.argv[1:] if argv is None else argv)
    vllm_style = bool(args) and args[0] == "serve"  # the vllm driver's command line
    if vllm_style:
        p.add_argument("serve")
        p.add_argument("served_model")
        a, _unknown = p.parse_known_args(args)
        a.model = a.served_model
    else:
        a = p.parse_args(args)
    if not 0 <= a.port <= 65535:
        p.error(f"--port must be from 0 to 65535, got {a.port}")
    serve(a.port, a.model, a.load_time_s, a.latency_ms, a.host, a.ignore_sigterm, a.hold_gpu_mib,
          a.spawn_child_ignoring_sigterm, a.sleep_s, a.wake_s, a.sleep_ram_mib, a.fail_wake,
          a.wake_level2_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
