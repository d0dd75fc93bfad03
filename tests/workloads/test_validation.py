"""Workload validation: everything is checked before anything is written to Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from makespan.errors import ValidationError
from makespan.models import load_fleet
from makespan.workloads import (Workload, chain, find_cycle, group, load_workload, parse_workload, submit_workload,
                           workload_status)

FLEET = Path("examples/render-pipeline.toml").resolve()


@pytest.fixture
def fleet():
    return load_fleet(FLEET)


def _steps(*specs):
    return {"name": "w", "steps": [dict(s) for s in specs]}


def _own_keys(r, keys):
    return sorted(r.scan_iter(f"{keys.prefix}:*"))


def test_cycle_is_named_and_nothing_enqueued(r, keys, fleet):
    wl = _steps({"name": "a", "endpoint": "chat", "service_s": 1, "depends_on": ["c"]},
                {"name": "b", "endpoint": "chat", "service_s": 1, "depends_on": ["a"]},
                {"name": "c", "endpoint": "chat", "service_s": 1, "depends_on": ["b"]},
                {"name": "d", "endpoint": "chat", "service_s": 1})
    with pytest.raises(ValidationError) as ei:
        submit_workload(r, keys, fleet, wl)
    msg = str(ei.value)
    assert "cycle" in msg
    cyc = ei.value.value.split(" -> ")
    assert cyc[0] == cyc[-1] and set(cyc) == {"a", "b", "c"} and len(cyc) == 4
    assert _own_keys(r, keys) == []


def test_self_dependency_is_a_cycle(fleet):
    with pytest.raises(ValidationError, match="cycle: a -> a"):
        parse_workload(_steps({"name": "a", "endpoint": "chat", "service_s": 1, "depends_on": ["a"]}), fleet)


@pytest.mark.parametrize("bad, field", [
    ({"name": "b", "endpoint": "nope", "service_s": 1}, "workload.steps.1.endpoint"),
    ({"name": "b", "endpoint": "chat", "service_s": 1, "depends_on": ["zzz"]}, "workload.steps.1.depends_on"),
    ({"name": "a", "endpoint": "chat", "service_s": 1}, "workload.steps.1.name"),
    ({"name": "b", "endpoint": "chat"}, "workload.steps.1"),
    ({"name": "b", "endpoint": "chat", "requests": 3, "prompt": "{user}"}, "workload.steps.1.prompt"),
    ({"name": "b", "endpoint": "chat", "requests": 3, "route": "/v2/x"}, "workload.steps.1.route"),
    ({"name": "b", "endpoint": "chat", "service_s": 1, "colour": "red"}, "workload.steps.1.colour"),
])
def test_bad_step_rejected_before_enqueue(r, keys, fleet, bad, field):
    wl = _steps({"name": "a", "endpoint": "chat", "service_s": 1}, bad)
    with pytest.raises(ValidationError) as ei:
        submit_workload(r, keys, fleet, wl)
    assert ei.value.field == field
    assert _own_keys(r, keys) == []


@pytest.mark.parametrize("bad, field, says", [
    # a step's work is held to a job's bound (30 days): 1e7 s was accepted, and so was an
    # estimate of 10^6 requests × 86,400 s (2,700 years)
    ({"name": "b", "endpoint": "chat", "service_s": 1e7}, "workload.steps.1.service_s", "30 days"),
    ({"name": "b", "endpoint": "chat", "requests": 1_000_000, "request_s": 86_400}, "workload.steps.1.requests",
     "30 days"),
    # said "Input should be less than or equal to 10000000" for NaN
    ({"name": "b", "endpoint": "chat", "service_s": float("nan")}, "workload.steps.1.service_s", "finite"),
])
def test_a_step_over_a_jobs_limits_is_rejected_before_enqueue(r, keys, fleet, bad, field, says):
    with pytest.raises(ValidationError, match=says) as ei:
        submit_workload(r, keys, fleet, _steps({"name": "a", "endpoint": "chat", "service_s": 1}, bad))
    assert ei.value.field == field
    assert _own_keys(r, keys) == []


def test_a_workload_name_over_200_characters_is_rejected_before_enqueue(r, keys, fleet):
    """A 100 KB name was written into the workload record."""
    wl = {"name": "n" * 100_000, "steps": [{"name": "a", "endpoint": "chat", "service_s": 1}]}
    with pytest.raises(ValidationError, match="at most 200 characters") as ei:
        submit_workload(r, keys, fleet, wl)
    assert ei.value.field == "workload.name"
    assert _own_keys(r, keys) == []


def test_a_repeated_step_dependency_is_one(r, keys, fleet):
    wl = _steps({"name": "a", "endpoint": "chat", "service_s": 1},
                {"name": "b", "endpoint": "chat", "service_s": 1, "depends_on": ["a", "a"]})
    status = workload_status(r, keys, submit_workload(r, keys, fleet, wl))
    assert status["deps"] == {"a": [], "b": ["a"]}
    assert json.loads(r.hget(keys.job(status["steps"]["b"]["job"]), "deps")) == [status["steps"]["a"]["job"]]


def test_builder_diamond_and_fan_out(fleet):
    wl = Workload("d", priority="HIGH", retry_budget=2)
    a = wl.step("a", "chat", requests=4)
    b = wl.step("b", "embed", requests=4)
    c = wl.step("c", "coder", service_s=3)
    d = wl.step("d", "judge", service_s=2)
    chain(a, group(b, c), d)
    spec = wl.spec(fleet)
    deps = {s.name: set(s.depends_on) for s in spec.steps}
    assert deps == {"a": set(), "b": {"a"}, "c": {"a"}, "d": {"b", "c"}}
    assert spec.topo_order()[0] == "a" and spec.topo_order()[-1] == "d"
    # nested chains inside a group: fan-out of two chains, fan-in
    wl2 = Workload("f")
    s = wl2.step("s", "chat", service_s=1)
    x1, x2 = wl2.step("x1", "chat", service_s=1), wl2.step("x2", "chat", service_s=1)
    y1, y2 = wl2.step("y1", "embed", service_s=1), wl2.step("y2", "embed", service_s=1)
    t = wl2.step("t", "judge", service_s=1)
    chain(s, group(chain(x1, x2), chain(y1, y2)), t)
    deps2 = {st.name: set(st.depends_on) for st in wl2.spec(fleet).steps}
    assert deps2 == {"s": set(), "x1": {"s"}, "x2": {"x1"}, "y1": {"s"}, "y2": {"y1"}, "t": {"x2", "y2"}}


def test_find_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    cyc = find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]})
    assert cyc in (["b", "c", "b"], ["c", "b", "c"])


def test_yaml_and_json_files_submit_whole(r, keys, fleet, tmp_path):
    y = tmp_path / "w.yaml"
    y.write_text("name: synth\npriority: HIGH\nretry_budget: 1\nsteps:\n"
                 "  - {name: gen, endpoint: chat, requests: 8, prompt: 'item {i}'}\n"
                 "  - {name: judge, endpoint: judge, requests: 8, depends_on: [gen]}\n"
                 "  - {name: emb, endpoint: embed, service_s: 4, depends_on: [gen]}\n")
    spec = load_workload(y, fleet)
    j = tmp_path / "w.json"
    j.write_text(spec.model_dump_json())
    assert load_workload(j, fleet) == spec
    wid = submit_workload(r, keys, fleet, spec)
    st = workload_status(r, keys, wid)
    assert st["state"] == "running" and set(st["steps"]) == {"gen", "judge", "emb"}
    assert r.zcard(keys.queue("HIGH")) == 3
    judge = r.hgetall(keys.job(st["steps"]["judge"]["job"]))
    assert json.loads(judge["deps"]) == [st["steps"]["gen"]["job"]]
    # planning estimate: ceil(8 requests / 8 judge slots) x 1 s
    assert float(judge["service_s"]) == 1.0
    assert json.loads(judge["spec"])["payload"]["requests"] == 8


def test_unparsable_file(fleet, tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("steps: [unclosed")
    with pytest.raises(ValidationError, match="workload file"):
        load_workload(p, fleet)


def test_cli_submit_workload(r, keys, settings, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, **settings.to_env()}
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {name: a, endpoint: chat, service_s: 1, depends_on: [b]}\n"
                   "  - {name: b, endpoint: chat, service_s: 1, depends_on: [a]}\n")
    p = subprocess.run([sys.executable, "-m", "makespan.cli", "submit-workload", str(bad), "--fleet", str(FLEET)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "cycle" in p.stderr
    assert _own_keys(r, keys) == []
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"steps": [{"name": "a", "endpoint": "chat", "service_s": 1},
                                          {"name": "b", "endpoint": "embed", "service_s": 1, "depends_on": ["a"]}]}))
    p = subprocess.run([sys.executable, "-m", "makespan.cli", "submit-workload", str(good), "--fleet", str(FLEET)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    wid = p.stdout.strip()
    p = subprocess.run([sys.executable, "-m", "makespan.cli", "workload-status", wid], env=env, capture_output=True,
                       text=True, timeout=60)
    assert json.loads(p.stdout)["steps"]["b"]["state"] == "queued"


def test_cli_submit_workload_reads_the_published_fleet(r, keys, settings, tmp_path):
    """``makespan submit-workload FILE`` without --fleet uses the fleet the planner published,
    as ``makespan submit`` does; a --fleet file given is checked against it (used while
    none is published). Before, --fleet was required. (found by a new-user trial,
    2026-12-05; fails on the code before its fix)"""
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app
    from makespan.models import fleet_version

    env = settings.to_env()
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"steps": [{"name": "a", "endpoint": "chat", "service_s": 1},
                                        {"name": "b", "endpoint": "embed", "service_s": 1, "depends_on": ["a"]}]}))

    def cli(*extra: str):
        return CliRunner().invoke(cli_app, ["submit-workload", str(wl), *extra], env=env)

    res = cli()  # no planner has published a fleet, and none given
    assert res.exit_code == 2 and "no planner has published a fleet yet" in res.output, res.output
    assert _own_keys(r, keys) == []
    published = load_fleet(FLEET)
    r.mset({keys.fleet: published.model_dump_json(), keys.fleet_version: fleet_version(published)})  # as the planner
    res = cli()
    assert res.exit_code == 0, res.output
    assert workload_status(r, keys, res.stdout.strip())["steps"]["b"]["state"] == "queued"
    other = Path("tests/workloads/fleet.toml").resolve()
    assert fleet_version(load_fleet(other)) != fleet_version(published)
    res = cli("--fleet", str(other))
    assert res.exit_code == 2 and "differs from the fleet the planner published" in res.output, res.output
    res = cli("--fleet", str(FLEET))
    assert res.exit_code == 0, res.output
    assert workload_status(r, keys, res.stdout.strip())["steps"]["a"]["state"] == "queued"
