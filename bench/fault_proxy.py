"""A TCP proxy between makespan's processes and Redis, for fault injection (the chaos
runner, bench/chaos.py, and tests/faults/test_half_open.py).

* :meth:`SilentProxy.silence_open` makes every connection open at that moment half-open:
  the proxy keeps both sockets open and reads what either side sends, but forwards
  nothing, so a client waits for a reply that never comes (as behind a NAT or a firewall
  that dropped its state). Connections opened afterwards work normally.
* :attr:`SilentProxy.latency_s` (seconds, 0: none) delays every chunk forwarded from
  Redis to its client by that much while it is set (a slow or congested network).
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.muted = False
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.upstream):
            try:
                s.close()
            except OSError:
                pass


class SilentProxy:
    """Forward ``127.0.0.1:{port}`` to ``(host, port)`` upstream, one thread per connection."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.latency_s = 0.0
        threading.Thread(target=self._accept, daemon=True, name="silent-proxy-accept").start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def silence_open(self) -> int:
        """Mute every connection open now; returns how many were muted."""
        with self._lock:
            live = [p for p in self._pairs if not p.closed]
            for p in live:
                p.muted = True
        return len(live)

    def open_count(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]
            return len(self._pairs)

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for p in self._pairs:
                p.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True, name="silent-proxy-pump").start()

    def _pump(self, pair: _Pair) -> None:
        peer = {pair.client: pair.upstream, pair.upstream: pair.client}
        try:
            while not pair.closed and not self._stopped.is_set():
                ready, _, _ = select.select(list(peer), [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        pair.close()
                        return
                    if not pair.muted:
                        if self.latency_s > 0 and s is pair.upstream:
                            time.sleep(self.latency_s)
                        peer[s].sendall(data)
        except OSError:
            pair.close()


class ProxyProcess:
    """A :class:`SilentProxy` in a process of its own (``python -m bench.fault_proxy``), so
    that the forwarding never waits for the GIL of the process that drives the faults
    (the chaos runner polls Redis and supervises processes meanwhile). Controlled by
    signals: SIGUSR1 silences the open connections, SIGUSR2 reads the latency to add
    from the control folder; SIGTERM ends it.

    Raises:
        RuntimeError: the proxy did not report its port within 10 s."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.control_dir = Path(tempfile.mkdtemp(prefix="makespan-proxy-"))
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.fault_proxy", "--upstream-host", upstream_host,
                                      "--upstream-port", str(upstream_port), "--control-dir", str(self.control_dir)],
                                     start_new_session=True)
        deadline = time.monotonic() + 10.0
        port_file = self.control_dir / "port"
        while not port_file.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("the fault proxy did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self._silenced = 0

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def silence_open(self, timeout_s: float = 5.0) -> int:
        """Mute every connection open now; returns how many were muted (-1: no answer)."""
        self._silenced += 1
        os.kill(self.proc.pid, signal.SIGUSR1)
        done = self.control_dir / f"silenced-{self._silenced}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done.exists():
                return int(done.read_text() or -1)
            time.sleep(0.01)
        return -1

    def set_latency(self, latency_s: float) -> None:
        """Delay every reply by ``latency_s`` seconds from now on (0: none)."""
        tmp = self.control_dir / "latency.tmp"
        tmp.write_text(repr(latency_s))
        tmp.replace(self.control_dir / "latency")
        os.kill(self.proc.pid, signal.SIGUSR2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.control_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.fault_proxy", description="a fault-injecting TCP proxy (ProxyProcess)")
    ap.add_argument("--upstream-host", default="127.0.0.1")
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--control-dir", type=Path, required=True)
    a = ap.parse_args(argv)
    proxy = SilentProxy(a.upstream_host, a.upstream_port)
    silenced = 0
    stop = threading.Event()

    def _silence(*_s) -> None:
        nonlocal silenced
        silenced += 1
        (a.control_dir / f"silenced-{silenced}").write_text(str(proxy.silence_open()))

    def _latency(*_s) -> None:
        try:
            proxy.latency_s = float((a.control_dir / "latency").read_text())
        except (OSError, ValueError):
            proxy.latency_s = 0.0

    signal.signal(signal.SIGUSR1, _silence)
    signal.signal(signal.SIGUSR2, _latency)
    signal.signal(signal.SIGTERM, lambda *_s: stop.set())
    (a.control_dir / "port.tmp").write_text(str(proxy.port))
    (a.control_dir / "port.tmp").replace(a.control_dir / "port")
    while not stop.wait(0.5):
        pass
    proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
