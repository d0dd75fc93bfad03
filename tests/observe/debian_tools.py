"""The Debian programs some observability tests run for real (``chromium``,
``prometheus``; ``.ci/run`` installs them), and small helpers to drive them."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest


def require_tool(name: str, package: str | None = None) -> str:
    """The path of the program ``name`` on PATH. When it is missing the test is skipped
    with the reason, except in CI (``CI=true``), where it fails: ``.ci/run`` installs it."""
    path = shutil.which(name)
    if path:
        return path
    why = f"{name} not found on PATH (Debian package {package or name}: apt-get install -y {package or name})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}; CI must have it (.ci/run installs it)")
    pytest.skip(why)


class Prometheus:
    """A real ``prometheus`` server scraping ``targets`` (host:port) every
    ``scrape_interval_s``, its data in ``work_dir``. Use as a context manager."""

    def __init__(self, binary: str, targets: dict[str, list[str]], work_dir: Path, port: int,
                 scrape_interval_s: float = 1.0):
        self.binary, self.targets, self.dir, self.port = binary, targets, Path(work_dir), port
        self.interval_s = scrape_interval_s
        self.proc: subprocess.Popen | None = None
        self.base = f"http://127.0.0.1:{port}"

    def _config(self) -> str:
        every = f"{round(self.interval_s * 1000)}ms"  # Prometheus durations take integers only
        lines = ["global:", f"  scrape_interval: {every}", f"  evaluation_interval: {every}",
                 "scrape_configs:"]
        for job, targets in self.targets.items():
            lines += [f"  - job_name: {job}", "    static_configs:",
                      "      - targets: [" + ", ".join(f'"{t}"' for t in targets) + "]"]
        return "\n".join(lines) + "\n"

    def __enter__(self) -> Prometheus:
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(self._config())
        log = open(self.dir / "prometheus.log", "ab")
        self.proc = subprocess.Popen([self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}: "
                                     f"{(self.dir / 'prometheus.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready within 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def query(self, expr: str) -> list[dict]:
        """The series an instant PromQL query returns (``data.result``)."""
        resp = httpx.get(f"{self.base}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert body.get("status") == "success", (expr, body)
        return body["data"]["result"]

    def targets_up(self) -> dict[str, str]:
        """scrape URL -> health (up, down, unknown) of every active target."""
        body = httpx.get(f"{self.base}/api/v1/targets", timeout=10).json()
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}


class Chromium:
    """Debian's ``chromium`` in headless mode, one process per page load, with its own
    profile directory (so concurrent runs do not share a profile lock)."""

    def __init__(self, binary: str, profile_dir: Path, window: tuple[int, int] = (1400, 900)):
        self.binary, self.profile, self.window = binary, Path(profile_dir), window

    def _run(self, url: str, extra: list[str], budget_ms: int, timeout_s: float) -> subprocess.CompletedProcess:
        self.profile.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--hide-scrollbars", f"--user-data-dir={self.profile}",
                f"--window-size={self.window[0]},{self.window[1]}", f"--virtual-time-budget={budget_ms}",
                *extra, url]
        return subprocess.run(args, capture_output=True, timeout=timeout_s, check=False)

    def dump_dom(self, url: str, budget_ms: int = 8000, timeout_s: float = 90.0) -> str:
        """The page's DOM after its scripts ran for ``budget_ms`` of virtual time."""
        res = self._run(url, ["--dump-dom"], budget_ms, timeout_s)
        dom = res.stdout.decode("utf-8", "replace")
        assert res.returncode == 0 and dom.strip(), (
            f"chromium --dump-dom {url}: rc {res.returncode}, stderr {res.stderr.decode(errors='replace')[-1500:]}")
        return dom

    def screenshot(self, url: str, out_png: Path, budget_ms: int = 8000, timeout_s: float = 90.0) -> Path:
        """A PNG of the page after ``budget_ms`` of virtual time; returns ``out_png``."""
        out_png = Path(out_png)
        out_png.parent.mkdir(parents=True, exist_ok=True)
        res = self._run(url, [f"--screenshot={out_png}"], budget_ms, timeout_s)
        assert res.returncode == 0 and out_png.exists() and out_png.read_bytes()[:4] == b"\x89PNG", (
            f"chromium --screenshot {url}: rc {res.returncode}, stderr {res.stderr.decode(errors='replace')[-1500:]}")
        return out_png
