"""The real endpoint program over real HTTP (spawned as a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from makespan.redis_conn import free_port

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _wait_status(url: str, want: int, timeout_s: float = 60.0) -> list[int]:
    """Poll ``url`` until it answers ``want``; ``timeout_s`` bounds a hang only (a server
    process starting on a loaded machine takes seconds)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            code = httpx.get(url, timeout=0.5).status_code
            seen.append(code)
            if code == want:
                return seen
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered {want}; saw {seen}")


@pytest.fixture
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "makespan.workers.endpoint_server", "--port", str(port),
                             "--load-time-s", "0.8", "--latency-ms", "20", "--model", "cards-v2"],
                            cwd=ROOT, stderr=subprocess.DEVNULL)
    yield f"http://127.0.0.1:{port}", proc
    proc.terminate()
    proc.wait(timeout=30)


def test_health_loading_then_ok_and_completions(server):
    url, proc = server
    seen = _wait_status(url + "/health", 200)
    assert 503 in seen  # it answered "loading" before it was ready
    c = httpx.post(url + "/v1/completions", json={"prompt": "card 1", "max_tokens": 8}, timeout=5).json()
    assert c["object"] == "text_completion" and c["model"] == "cards-v2"
    assert c["choices"][0]["text"] and c["usage"]["total_tokens"] > 0
    chat = httpx.post(url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}]}, timeout=5).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    emb = httpx.post(url + "/v1/embeddings", json={"input": ["a", "b"]}, timeout=5).json()
    assert [d["index"] for d in emb["data"]] == [0, 1] and len(emb["data"][0]["embedding"]) == 8
    assert httpx.post(url + "/v1/completions", content=b"not json", timeout=5).status_code == 400
    assert "endpoint_requests_total 3" in httpx.get(url + "/metrics").text


def test_sleep_and_wake(server):
    url, _ = server
    _wait_status(url + "/health", 200)
    assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": False}
    assert httpx.post(url + "/sleep?level=1").status_code == 200
    assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 503
    assert httpx.post(url + "/wake_up").status_code == 200
    assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 200


def test_sigterm_exits_cleanly(server):
    url, proc = server
    _wait_status(url + "/health", 200)
    proc.terminate()
    assert proc.wait(timeout=30) == 0  # bounds a hang only: a loaded host delays the server's shutdown
