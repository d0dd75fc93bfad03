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

import select
import socket
import threading
import time


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
