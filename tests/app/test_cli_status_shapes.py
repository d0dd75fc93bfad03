"""What a new user reported of the status JSON and the ``jobs`` listing: ``workload-status``
gave ``retry_budget`` and the workload's times as strings beside numbers for the steps'
times; ``status`` gave times only as bare epoch floats (and a step's ``deps`` as JSON text,
its ``retries`` as a string); ``jobs --state completed`` left the ETA/OUTCOME column of a
completed job empty. Real Redis, the real CLI and the store's own scripts."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.client import Client
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.store import JobState, LeaseStore
from makespan.store.leases import finish_job_op, start_job_op
from makespan.workloads import cancel_workload, load_workload, submit_workload
from tests.conftest import FLEET_TOML

SYNTH = Path(__file__).resolve().parents[2] / "examples" / "synth.yaml"


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}


def _unix_s(iso_text: str) -> float:
    assert iso_text.endswith("Z"), iso_text
    return dt.datetime.fromisoformat(iso_text[:-1] + "+00:00").timestamp()


def _cli_json(argv: list[str], redis_url: str, prefix: str):
    res = CliRunner().invoke(cli_app, argv, env=_env(redis_url, prefix))
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_workload_status_gives_one_type_per_kind_of_value(r, keys, settings, redis_url, prefix):
    fleet = load_fleet(FLEET_TOML)
    wid = submit_workload(r, keys, fleet, load_workload(SYNTH, fleet), settings)
    running = _cli_json(["workload-status", wid], redis_url, prefix)
    assert running == Client(r, settings).workload_status(wid)  # the client gives what the CLI prints
    assert isinstance(running["retry_budget"], int) and running["retry_budget"] == 1
    assert isinstance(running["submitted_at"], float) and running["reason"] == ""
    assert running["finished_at"] is None and running["failed_at"] is None and running["finished_at_utc"] is None
    assert abs(_unix_s(running["submitted_at_utc"]) - running["submitted_at"]) < 0.001
    for step in running["steps"].values():
        assert isinstance(step["retries"], int) and step["started_at"] is None and step["started_at_utc"] is None

    cancel_workload(r, keys, wid)
    ended = _cli_json(["workload-status", wid], redis_url, prefix)
    assert ended["state"] == "cancelled" and ended["reason"] == "workload cancelled"
    assert isinstance(ended["finished_at"], float) and ended["finished_at"] >= ended["submitted_at"]
    assert abs(_unix_s(ended["finished_at_utc"]) - ended["finished_at"]) < 0.001
    for step in ended["steps"].values():
        assert isinstance(step["finished_at"], float)
        assert abs(_unix_s(step["finished_at_utc"]) - step["finished_at"]) < 0.001


def test_status_gives_utc_times_beside_the_unix_ones_and_typed_fields(r, keys, settings, redis_url, prefix):
    fleet = load_fleet(FLEET_TOML)
    wid = submit_workload(r, keys, fleet, load_workload(SYNTH, fleet), settings)
    steps = Client(r, settings).workload_status(wid)["steps"]
    final = _cli_json(["status", steps["final"]["job"]], redis_url, prefix)
    assert final["deps"] == [steps["judge"]["job"], steps["embed"]["job"]]  # a list, not JSON text
    assert final["retries"] == 0 and isinstance(final["service_s"], float)
    assert abs(_unix_s(final["submitted_at_utc"]) - final["submitted_at"]) < 0.001
    assert final["wait_eta"] is None and final["wait_eta_utc"] is None  # no planner: no ETA, in both forms
    assert final["reason"] == ""  # present on a waiting job too (a script's status["reason"] raised KeyError)
    cancel_workload(r, keys, wid)
    ended = _cli_json(["status", steps["final"]["job"]], redis_url, prefix)
    assert ended["state"] == "cancelled" and abs(_unix_s(ended["finished_at_utc"]) - ended["finished_at"]) < 0.001


def _complete(r, keys, job_id: str, finished_at_s: float) -> None:
    """Lease ``job_id`` and finish it ``completed`` through the store's fenced scripts, as a
    GPU worker does."""
    leases = LeaseStore(r, keys)
    lease = leases.acquire("L-" + job_id, ("gpu-test-0",), 30.0, job_id=job_id, queue=keys.queue("NORMAL"))
    assert lease is not None
    assert leases.fenced(lease, [start_job_op(keys, job_id, finished_at_s - 1.0),
                                 finish_job_op(keys, job_id, JobState.COMPLETED, finished_at_s, "")])


def test_jobs_completed_says_when_each_job_ended(r, keys, settings, redis_url, prefix):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    done, gone = prod.submit({"endpoint": "chat", "service_s": 5}), prod.submit({"endpoint": "chat", "service_s": 5})
    finished_at_s = time.time()
    _complete(r, keys, done.id, finished_at_s)
    assert prod.cancel(gone.id) == "cancelled"
    ended_text = dt.datetime.fromtimestamp(finished_at_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    env = _env(redis_url, prefix)
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "completed"], env=env)
    assert res.exit_code == 0, res.output
    rows = res.output.splitlines()[1:]
    assert [row.split(None, 5)[:5] for row in rows] == [[done.id, "NORMAL", "chat", "completed", "-"]]
    assert rows[0].split(None, 5)[5] == f"ended {ended_text}"  # not an empty ETA/OUTCOME cell
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "cancelled"], env=env)
    cell = res.output.splitlines()[1].split(None, 5)[5]
    assert cell.startswith("ended ") and cell.endswith(": " + r.hget(keys.job(gone.id), "reason")), cell
    res = CliRunner().invoke(cli_app, ["jobs", "--state", "completed", "--json"], env=env)
    assert json.loads(res.output)["finished_at"] == finished_at_s
    res = CliRunner().invoke(cli_app, ["why", done.id], env=env)
    assert res.output.startswith(f"{done.id}: completed, ended {ended_text}"), res.output


def test_status_of_a_leased_job_asked_to_cancel_says_so_as_a_bool(r, keys, settings, redis_url, prefix):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    assert LeaseStore(r, keys).acquire("L-" + job.id, ("gpu-test-0",), 30.0, job_id=job.id,
                                       queue=keys.queue("NORMAL")) is not None
    assert prod.cancel(job.id) == "cancel_requested"
    status = _cli_json(["status", job.id], redis_url, prefix)
    assert status["state"] == "leased" and status["cancel_requested"] is True, status
    assert abs(_unix_s(status["leased_at_utc"]) - status["leased_at"]) < 0.001
