"""A TCP proxy for tests that can silence the connections open through it.

:meth:`SilentProxy.silence_open` makes every connection open at that moment half-open:
the proxy keeps both sockets open and reads what either side sends, but forwards
nothing, so a client waits for a reply that never comes (as behind a NAT or a firewall
that dropped its state). Connections opened afterwards work normally.
"""

from __future__ import annotations

import select
import socket
import threading


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
                        peer[s].sendall(data)
        except OSError:
            pair.close()
