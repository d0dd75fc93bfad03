"""Multi-step workloads through :func:`makespan.connect`'s client (found by a new-user trial:
docs/workloads.md's Python example called ``submit_workload(r, keys, fleet, wl)`` with
none of them defined, and the client had no way to submit a workload). In-process, on
the real Redis: the fleet is published as a planner would; no planner runs, so the steps
stay queued."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import makespan
from makespan.models import fleet_version, load_fleet
from tests.conftest import FLEET_TOML

ROOT = Path(__file__).resolve().parents[2]


def _python_example(page: Path, section: str) -> str:
    """The first python code block under the heading ``section`` of ``page``."""
    text = page.read_text()
    after = text[text.index(f"\n## {section}\n"):]
    return re.search(r"^```python\n(.*?)^```", after, re.M | re.S).group(1)


@pytest.fixture
def published(r, keys, redis_url, prefix, monkeypatch):
    """The fleet published as the planner does; MAKESPAN_REDIS_URL / MAKESPAN_KEY_PREFIX
    point ``makespan.connect()`` (no arguments, as the docs call it) at this test's keys."""
    fleet = load_fleet(FLEET_TOML)
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})
    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", prefix)


def test_the_docs_python_workload_example_runs_as_written(published, r, keys, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # its comment names examples/synth.yaml relative to the repository
    code = _python_example(ROOT / "docs" / "workloads.md", "Python")
    scope: dict = {}
    exec(compile(code, "docs/workloads.md", "exec"), scope)  # noqa: S102 - the doc's own snippet
    client, wid = scope["client"], scope["wid"]
    try:
        assert capsys.readouterr().out.split() == [wid, "running"]
        status = client.workload_status(wid)
        assert (status["name"], status["priority"]) == ("synth", "HIGH")
        assert set(status["steps"]) == {"gen", "judge", "embed", "final"}
        assert status["deps"]["final"] == ["judge", "embed"]
        assert r.zscore(keys.workloads, wid) is not None
    finally:
        client.close()


def test_the_client_submits_a_step_file_reports_and_cancels_it(published, r, keys):
    with makespan.connect() as client:
        wid = client.submit_workload(ROOT / "examples" / "synth.yaml")
        assert client.workload_status(wid)["state"] == "running"
        out = client.cancel_workload(wid)
        assert out == {"cancelled": 4, "cancel_requested": 0}  # no planner: every step still queued
        status = client.workload_status(wid)
        assert status["state"] == "cancelled"
        assert {s["state"] for s in status["steps"].values()} == {"cancelled"}
        with pytest.raises(makespan.NotFoundError):
            client.workload_status("no-such-workload")
        with pytest.raises(makespan.NotFoundError):
            client.cancel_workload("no-such-workload")


def test_the_client_rejects_an_invalid_workload_before_writing(published, r, keys):
    from makespan.workloads import Workload

    wl = Workload("bad")
    wl.step("a", "no-such-endpoint", service_s=1)
    with makespan.connect() as client:
        with pytest.raises(makespan.ValidationError, match="no-such-endpoint"):
            client.submit_workload(wl)
    assert r.zcard(keys.workloads) == 0


def test_submit_workload_without_a_published_fleet_says_how_to_get_one(r, keys, redis_url, prefix):
    from makespan.workloads import Workload

    wl = Workload("lonely")
    wl.step("a", "chat", service_s=1)
    with makespan.connect(redis_url, key_prefix=prefix) as client:
        with pytest.raises(makespan.ValidationError, match="no planner has published a fleet"):
            client.submit_workload(wl)
