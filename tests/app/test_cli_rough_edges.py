"""Rough edges a new-user trial of the CLI found: a missing-fleet error that named only
the Python remedy to a command-line user, ``makespan incidents`` printing local time
without a zone (beside ``why``/``jobs`` in UTC) and strings for numbers in its JSON, and
options without help text. Real Redis, the real CLI."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import click
import typer.main
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.workers.observer import list_incidents

SYNTH = Path(__file__).resolve().parents[2] / "examples" / "synth.yaml"


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}


def test_no_published_fleet_names_the_command_line_remedy(r, redis_url, prefix):
    res = CliRunner().invoke(cli_app, ["submit-workload", str(SYNTH)], env=_env(redis_url, prefix))
    assert res.exit_code == 2 and "no planner has published a fleet yet" in res.output, res.output
    assert "--fleet FILE on the command line" in res.output, res.output  # not only makespan.connect(fleet=)


def test_incidents_print_utc_and_give_numbers_as_numbers(r, keys, redis_url, prefix):
    detected_at_s = 1796514940.5
    incident_id = r.xadd(keys.incidents, {  # the fields the observer writes (workers/observer.py _incident)
        "kind": "incident", "endpoint": "coder", "instance_id": "abc", "host": "host-a", "gpus": '["GPU-host-a-0"]',
        "failure_mode": "process_exited", "detected_at": repr(detected_at_s), "cycle": "5", "last_ok_cycle": "4",
        "effect": "endpoint coder unavailable", "agenda_context": "[]"})
    r.xadd(keys.incidents, {"kind": "recovery", "incident_id": incident_id, "outcome": "recovered",
                            "new_instance_id": "def", "recovered_at": repr(detected_at_s + 0.5), "recovery_s": "0.521"})
    (row,) = list_incidents(r, keys)
    assert (row["cycle"], row["last_ok_cycle"], row["recovery"]["recovery_s"]) == (5, 4, 0.521)
    assert row["detected_at_utc"] == "2026-12-05T23:55:40.500Z"
    assert row["recovery"]["recovered_at"] == detected_at_s + 0.5
    assert row["recovery"]["recovered_at_utc"] == "2026-12-05T23:55:41.000Z"
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["incidents"], env=env)
    when = dt.datetime.fromtimestamp(detected_at_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    assert res.exit_code == 0 and f"{incident_id}  {when}  coder  process_exited" in res.output, res.output
    assert "recovery=recovered in 0.521 s" in res.output
    res = CliRunner().invoke(cli_app, ["incidents", "--json"], env=env)
    assert json.loads(res.output)["cycle"] == 5


def test_every_option_of_every_command_says_what_it_does():
    group = typer.main.get_command(cli_app)
    ctx = click.Context(group)
    bare = {name: [param.opts[0] for param in group.get_command(ctx, name).params
                   if param.param_type_name == "option" and not param.help and param.opts[0] != "--help"]
            for name in group.list_commands(ctx)}
    assert {name: opts for name, opts in bare.items() if opts} == {}


@pytest.mark.parametrize(("given", "meant"), [("myjobs.py", "myjobs"), ("jobs/gpu_jobs.py", "jobs.gpu_jobs"),
                                              ("./gpu_jobs.py", "gpu_jobs")])
def test_workloads_given_as_a_file_path_names_the_module(given, meant):
    """``--workloads myjobs.py`` said "No module named 'myjobs.py'; 'myjobs' is not a
    package", and ``./myjobs.py`` raised a TypeError (workload-author new user)."""
    from makespan.errors import ValidationError
    from makespan.registry import load_modules

    with pytest.raises(ValidationError, match=f"did you mean '{meant}'"):
        load_modules(given)


@pytest.mark.parametrize(("source", "raised", "line"), [("def f(:\n    pass\n", "SyntaxError", 1),
                                                         ("x = 1\nraise RuntimeError('no config')\n", "RuntimeError: no config", 2)])
def test_a_workloads_module_whose_code_raises_is_one_error_naming_the_file_and_line(tmp_path, monkeypatch, source,
                                                                                    raised, line):
    """A SyntaxError or a RuntimeError at import exited 1 with a rich traceback, a missing
    import 2 with one line (workload-author user): both are one line, exit 2, file and line."""
    from makespan.errors import ValidationError
    from makespan.registry import load_modules

    name = f"broken_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValidationError, match=f"importing it raised {raised}") as e:
        load_modules(name)
    assert f"{name}.py:{line}" in str(e.value), str(e.value)


def test_a_workloads_module_slow_to_import_is_logged_with_where_it_waits(tmp_path, monkeypatch, caplog):
    """A module that blocks at import (a network share, a lock, a download) left the GPU
    worker silent (a stop-51 left-alone item): past the threshold a WARNING names the
    module and the line it waits on; a fast import logs nothing."""
    import logging

    from makespan import registry

    monkeypatch.setattr(registry, "SLOW_IMPORT_WARN_S", 0.3)
    slow, fast = (f"{kind}_{tmp_path.name.replace('-', '_')}" for kind in ("slow", "fast"))
    (tmp_path / f"{slow}.py").write_text("import threading\nthreading.Event().wait(1.5)  # the model share\n")
    (tmp_path / f"{fast}.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="makespan.registry"):
        registry.load_modules(fast)
        assert not caplog.records
        registry.load_modules(slow)
    (record,) = caplog.records
    assert f"importing workload module '{slow}' has taken" in record.getMessage()
    assert f"{slow}.py\", line 2" in record.getMessage() and "the model share" in record.getMessage()


def test_a_failed_import_inside_a_workloads_package_names_the_file_and_line(tmp_path, monkeypatch):
    """`--workloads pkgx` whose pkgx/inner.py imports a missing module said only "No module
    named ..." (a verifier's report): the file and line of that import are named."""
    from makespan.errors import ValidationError
    from makespan.registry import load_modules

    package = tmp_path / f"pkg_{tmp_path.name.replace('-', '_')}"
    package.mkdir()
    (package / "__init__.py").write_text("from . import inner\n")
    (package / "inner.py").write_text("x = 1\nimport not_installed_zz_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValidationError, match="No module named 'not_installed_zz_module'") as e:
        load_modules(package.name)
    assert f"{package.name}/inner.py:2" in str(e.value), str(e.value)


def test_a_repeated_workloads_option_loads_every_module(monkeypatch):
    """`--workloads a --workloads b` kept only b, silently (a verifier's report)."""
    import makespan.cli as cli

    seen = {}

    def stop_after_loading(workloads):
        seen["workloads"] = workloads
        raise SystemExit(0)

    monkeypatch.setattr("makespan.registry.load_modules", stop_after_loading)
    # the command sets these in this process: recorded here (set, then removed) so they are
    # restored after the test (a delenv of an unset name records nothing: MAKESPAN_WORKLOADS
    # leaked into a later test's GPU worker subprocess, which failed to import 'mod_a')
    for name in ("MAKESPAN_WORKLOADS", "MAKESPAN_FLEET", "MAKESPAN_HOST"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    res = CliRunner().invoke(cli.app, ["gpu-worker", "--fleet", "examples/render-pipeline.toml", "--host", "host-a",
                                       "--no-check-gpus", "--workloads", "mod_a,mod_b", "--workloads", "mod_c"])
    assert seen.get("workloads") == "mod_a,mod_b,mod_c", (seen, res.output)


@pytest.mark.parametrize("args, says", [
    (["submit", "--endpoint", "embed", "--service-s", "1", "--args", "not json"], "--args and --kwargs are a workload"),
    (["submit", "--endpoint", "embed", "--service-s", "1", "--kwargs", '{"x": 1}'], "--args and --kwargs are a workload"),
    (["submit", "some.fn", "--payload", '{"x": 1}'], "--payload is for a plain job"),
    (["submit", "--endpoint", "embed", "--service-s", "1", "--idempotency-key", ""], "idempotency_key: is empty"),
    (["submit", "--endpoint", "embed", "--service-s", "1", "--payload", "[" * 100_000], "--payload: not JSON"),
    (["submit", "some.fn", "--args", "[" * 100_000], "--args: not JSON"),
    (["submit", "--endpoint", "embed"], "a plain job needs --service-s (or"),  # it named both, one given
    (["submit", "--service-s", "1"], "a plain job needs --endpoint (or"),
])
def test_submit_input_the_cli_used_to_drop_is_refused(r, keys, redis_url, prefix, args, says):
    """Input a submit silently ignored (a plain job's --args/--kwargs, a function's --payload,
    an empty --idempotency-key: an unset $KEY lost the idempotency asked for) or that crashed
    it (deeply nested JSON: a RecursionError traceback) is refused with one line, and nothing
    is written (a CLI review, 2026-12-07)."""
    res = CliRunner().invoke(cli_app, [*args, "--fleet", str(SYNTH.parent / "render-pipeline.toml")],
                             env=_env(redis_url, prefix))
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output, res.output
    assert not list(r.scan_iter(f"{prefix}:*")), "a refused submit writes nothing"


def test_observer_bounds_are_checked(tmp_path):
    from makespan.workers.observer import main as observer_main

    fleet = str(SYNTH.parent / "render-pipeline.toml")
    for option, value in (("--probe-interval-s", "0"), ("--overrun-factor", "-2"), ("--host-down-grace-s", "nan")):
        assert observer_main(["--fleet", fleet, option, value]) == 2, option  # an interval of 0 spun a CPU


def test_version_and_the_short_help_option():
    import makespan

    res = CliRunner().invoke(cli_app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"makespan {makespan.__version__}", res.output
    for args in (["-h"], ["submit", "-h"]):
        res = CliRunner().invoke(cli_app, args)
        assert res.exit_code == 0 and "Usage: " in res.output, (args, res.output)


@pytest.mark.parametrize("args, says", [
    (["render-pipeline", "--host", "host-z"], "host: the render pipeline runs on a host where coder"),  # StopIteration
    (["render-pipeline", "--cards", "-1"], "cards: must be at least 1"),
    (["render-pipeline", "--time-scale", "0"], "time_scale: must be a positive"),
    (["gpu-worker", "--fleet", str(SYNTH.parent / "render-pipeline.toml"), "--host", "host-a", "--concurrency", "-3"],
     "concurrency: must be at least 1"),  # was Celery's banner, then a traceback
    (["endpoint-server", "--port", "99999"], "Invalid value for '--port'"),  # was an OverflowError traceback
])
def test_out_of_range_options_get_one_line(redis_url, prefix, args, says):
    res = CliRunner().invoke(cli_app, args, env=_env(redis_url, prefix))
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output, res.output


def test_the_ended_dependency_warning_reads_ids_as_the_submit_does(r, keys, redis_url, prefix):
    fleet = str(SYNTH.parent / "render-pipeline.toml")
    env = _env(redis_url, prefix)
    first = CliRunner().invoke(cli_app, ["submit", "-q", "--endpoint", "embed", "--service-s", "1", "--fleet", fleet],
                               env=env)
    dep = first.output.strip().splitlines()[-1]  # the id; warnings (no planner runs here) come before it
    assert CliRunner().invoke(cli_app, ["cancel", dep], env=env).exit_code == 0
    for given in ([f"{dep} "], [dep, dep]):  # no warning for the first before, two for the second
        args = [arg for one in given for arg in ("--depends-on", one)]
        res = CliRunner().invoke(cli_app, ["submit", "-q", "--endpoint", "embed", "--service-s", "1", "--fleet", fleet,
                                           *args], env=env)
        assert res.exit_code == 0, res.output
        assert res.output.count(f"warning: dependency {dep}") == 1, (given, res.output)


def test_a_deadline_under_a_policy_that_does_not_plan_by_it_gets_a_note(r, keys, redis_url, prefix):
    """A new user submitted with --deadline-s under the default policy and nothing said that it
    would not change the plan; only the report, afterwards, said the job was late."""
    import json

    fleet = str(SYNTH.parent / "render-pipeline.toml")
    env = _env(redis_url, prefix)
    args = ["submit", "-q", "--endpoint", "embed", "--service-s", "1", "--deadline-s", "60", "--fleet", fleet]
    r.set(keys.planner_config, json.dumps({"planner": "p", "policy": "default"}))
    res = CliRunner().invoke(cli_app, args, env=env)
    assert res.exit_code == 0 and "note: the planner's policy is 'default': deadline_s does not change the plan" \
        in res.output, res.output
    r.set(keys.planner_config, json.dumps({"planner": "p", "policy": "tardiness"}))
    res = CliRunner().invoke(cli_app, args, env=env)
    assert res.exit_code == 0 and "deadline_s does not change the plan" not in res.output, res.output


def test_incidents_shows_the_latest_limit_and_says_how_many_there_are(r, keys, redis_url, prefix):
    """A big fleet's incident stream (capped at 10,000) printed whole, oldest first: the
    newest were at the bottom of thousands of lines (a fleet-scale operator)."""
    for index in range(5):
        r.xadd(keys.incidents, {  # the fields the observer writes (workers/observer.py _incident)
            "kind": "incident", "endpoint": f"ep{index}", "instance_id": "abc", "host": "host-a",
            "gpus": json.dumps([f"GPU-host-a-{gpu}" for gpu in range(8)]),
            "failure_mode": "process_exited", "detected_at": repr(1e9 + index), "cycle": "5", "last_ok_cycle": "4",
            "effect": "endpoint unavailable", "agenda_context": "[]"})
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["incidents", "--limit", "2"], env=env)
    assert res.exit_code == 0 and "the latest 2 of 5 incidents" in res.stderr, (res.output, res.stderr)
    assert "3 older ones have no recovery yet" in res.stderr, res.stderr
    assert "ep3" in res.stdout and "ep4" in res.stdout and "ep2" not in res.stdout, res.stdout
    assert "gpus=GPU-host-a-0,GPU-host-a-1,… (8 GPUs: --json lists them)" in res.stdout, res.stdout
    every = CliRunner().invoke(cli_app, ["incidents", "--limit", "0", "--json"], env=env)
    assert len(every.output.strip().splitlines()) == 5


@pytest.mark.parametrize("ids", [[""], ["", ""], ["aaa", "bbb", "aaa"]])
def test_cancel_of_empty_or_unknown_ids_is_one_line_per_id_and_exit_2(r, keys, redis_url, prefix, ids):
    """``makespan cancel ""`` raised StopIteration (a traceback) after the cancels were batched
    (a verifier); an id given twice is answered once."""
    res = CliRunner().invoke(cli_app, ["cancel", *ids], env=_env(redis_url, prefix))
    assert res.exit_code == 2 and "Traceback" not in res.output and "StopIteration" not in res.output, res.output
    if len(set(ids)) > 1:
        assert res.output.count("aaa unknown") == 1 and "2 unknown" in res.output and "no job" not in res.output
    else:  # `cancel "" ""` answers as `cancel ""` (it printed " unknown")
        assert "error: no job ''" in res.output, res.output
