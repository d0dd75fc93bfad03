"""Rough edges of the CLI's answers: ``cancel`` of a job that had already ended said the
same as a cancel that did something (and exited 0); ``jobs --state leased|running`` left
its ETA/OUTCOME cell empty; the no-fleet error ended in ``(got None)``; ``status --fleet``
and ``cancel --fleet`` took a file they never used (and failed on a missing one);
``jobs --endpoint TYPO`` listed nothing, silently, while no fleet was published;
``cancel-workload`` of a finished workload answered zeros and nothing else. Real Redis,
the real CLI and the store's own scripts."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.models import fleet_version, load_fleet
from makespan.producer import Producer
from makespan.store import JobState, LeaseStore
from makespan.store.leases import finish_job_op, start_job_op
from makespan.workloads import advance_workloads, cancel_workload, load_workload, submit_workload
from tests.conftest import FLEET_TOML

SYNTH = Path(__file__).resolve().parents[2] / "examples" / "synth.yaml"
EXIT_ALREADY_ENDED = 5  # documented: `makespan cancel --help`, docs/workloads.md (makespan.cli_support)


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}


def _invoke(argv: list[str], redis_url: str, prefix: str):
    return CliRunner().invoke(cli_app, argv, env=_env(redis_url, prefix))


def _publish_fleet(r, keys) -> None:
    """Publish the test fleet as a planner does (``P:fleet``, ``P:fleet:version``)."""
    fleet = load_fleet(FLEET_TOML)
    r.set(keys.fleet, fleet.model_dump_json())
    r.set(keys.fleet_version, fleet_version(fleet))


def test_no_fleet_error_says_only_what_to_do(r, redis_url, prefix):
    res = _invoke(["submit-workload", str(SYNTH)], redis_url, prefix)
    assert res.exit_code == 2 and "no planner has published a fleet yet" in res.output, res.output
    assert "(got None)" not in res.output, res.output
    assert f"under key prefix {prefix!r} at {redis_url}" in res.output, res.output  # where it looked
    res = _invoke(["submit", "--endpoint", "chat", "--service-s", "1"], redis_url, prefix)
    assert res.exit_code == 2 and "submitting needs a fleet" in res.output, res.output
    assert "(got None)" not in res.output, res.output
    assert f"under key prefix {prefix!r} at {redis_url}" in res.output, res.output


def _utc(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _lease(r, keys, job_id: str):
    lease = LeaseStore(r, keys).acquire("L-" + job_id, ("gpu-" + job_id,), 30.0, job_id=job_id,
                                        queue=keys.queue("NORMAL"))
    assert lease is not None
    return lease


def test_cancel_tells_a_cancel_that_did_something_from_one_that_found_the_job_ended(r, keys, settings, redis_url,
                                                                                      prefix):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    queued, done, leased = (prod.submit({"endpoint": "chat", "service_s": 5}) for _ in range(3))
    res = _invoke(["cancel", queued.id], redis_url, prefix)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "cancelled\n", ""), res.output
    res = _invoke(["cancel", queued.id], redis_url, prefix)
    ended_text = _utc(float(r.hget(keys.job(queued.id), "finished_at")))
    assert (res.exit_code, res.stdout) == (EXIT_ALREADY_ENDED, "cancelled\n"), res.output
    assert f"job {queued.id} had already ended (cancelled at {ended_text}): nothing to cancel" in res.stderr

    finished_at_s = time.time()
    lease = _lease(r, keys, done.id)
    assert LeaseStore(r, keys).fenced(lease, [start_job_op(keys, done.id, finished_at_s - 1.0),
                                              finish_job_op(keys, done.id, JobState.COMPLETED, finished_at_s, "")])
    res = _invoke(["cancel", done.id], redis_url, prefix)
    assert (res.exit_code, res.stdout) == (EXIT_ALREADY_ENDED, "completed\n"), res.output
    assert f"had already ended (completed at {_utc(finished_at_s)})" in res.stderr

    _lease(r, keys, leased.id)
    res = _invoke(["cancel", leased.id], redis_url, prefix)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "cancel_requested\n", ""), res.output
    res = _invoke(["cancel", leased.id], redis_url, prefix)
    assert (res.exit_code, res.stdout) == (0, "cancel_requested\n") and "already requested" in res.stderr, res.output

    # the client's documented answer is unchanged; the richer one tells the cases apart
    assert prod.cancel(queued.id) == "cancelled" and prod.cancel(leased.id) == "cancel_requested"
    again = prod.cancel_outcome(queued.id)
    assert (again.state, again.already_ended, again.cancelled_now) == ("cancelled", True, False)
    fresh = prod.submit({"endpoint": "chat", "service_s": 5})
    now = prod.cancel_outcome(fresh.id)
    assert (now.state, now.already_ended, now.cancelled_now, now.finished_at is not None) == ("cancelled", False,
                                                                                                True, True)


def test_jobs_leased_and_running_say_since_when_and_in_which_phase(r, keys, settings, redis_url, prefix):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    lease = _lease(r, keys, job.id)
    leased_at_s = float(r.hget(keys.job(job.id), "leased_at"))

    def cell(state: str) -> str:
        res = _invoke(["jobs", "--state", state], redis_url, prefix)
        assert res.exit_code == 0, res.output
        (row,) = res.stdout.splitlines()[1:]
        assert row.split(None, 5)[:5] == [job.id, "NORMAL", "chat", state, "-"], row
        return row.split(None, 5)[5]

    text = cell("leased")
    assert text.startswith(f"leased {_utc(leased_at_s)} (") and text.endswith(" s ago), between phases"), text
    assert LeaseStore(r, keys).claim_phase(lease, "start_endpoint") == "claimed"
    assert cell("leased").endswith(", phase start_endpoint")

    started_at_s = leased_at_s + 2.0
    assert LeaseStore(r, keys).fenced(lease, [start_job_op(keys, job.id, started_at_s)])
    r.hset(keys.phase(lease.lease_id), "start_endpoint", "done")
    assert LeaseStore(r, keys).claim_phase(lease, "execute") == "claimed"
    assert prod.cancel(job.id) == "cancel_requested"
    text = cell("running")
    assert text.startswith(f"running since {_utc(started_at_s)} (") and text.endswith(
        ", phase execute, cancel requested"), text
    res = _invoke(["jobs", "--state", "leased", "--json"], redis_url, prefix)
    row = json.loads(res.stdout)
    assert (row["leased_at"], row["started_at"], row["phase"], row["cancel_requested"]) == (
        leased_at_s, started_at_s, "execute", True)
    res = _invoke(["why", job.id], redis_url, prefix)
    assert res.stdout.startswith(f"{job.id}: running since {_utc(started_at_s)}"), res.output  # not "running, running"
    # its function's last progress report, in the listing and its JSON (a new user read `status` per job for it)
    r.hset(keys.job(job.id), mapping={"progress_done": "6.0", "progress_total": "30.0", "progress_note": "card 6"})
    assert cell("running").endswith(", phase execute, progress 6/30 (card 6), cancel requested")
    row = json.loads(_invoke(["jobs", "--state", "running", "--json"], redis_url, prefix).stdout)
    assert row["progress"] == {"done": 6.0, "total": 30.0, "note": "card 6"}


def test_status_and_cancel_take_the_old_fleet_option_and_say_it_is_ignored(r, keys, settings, redis_url, prefix,
                                                                           tmp_path):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "chat", "service_s": 5})
    missing = str(tmp_path / "no-such-fleet.toml")
    res = _invoke(["status", job.id, "--fleet", missing], redis_url, prefix)
    assert res.exit_code == 0 and json.loads(res.stdout)["state"] == "queued", res.output
    assert "--fleet is deprecated and ignored" in res.stderr
    res = _invoke(["cancel", job.id, "--fleet", FLEET_TOML], redis_url, prefix)
    assert (res.exit_code, res.stdout) == (0, "cancelled\n") and "--fleet is deprecated" in res.stderr, res.output
    for command in ("status", "cancel"):
        assert "--fleet" not in _invoke([command, "--help"], redis_url, prefix).stdout


def test_jobs_with_an_unknown_endpoint_fails_or_says_it_could_not_check(r, keys, settings, redis_url, prefix):
    res = _invoke(["jobs", "--endpoint", "chta"], redis_url, prefix)
    assert res.exit_code == 0 and "--endpoint 'chta' could not be checked" in res.stderr, res.output
    _publish_fleet(r, keys)
    res = _invoke(["jobs", "--endpoint", "chta"], redis_url, prefix)
    known = ", ".join(sorted(load_fleet(FLEET_TOML).endpoints))
    assert res.exit_code == 2 and f"not an endpoint of the published fleet; known: {known}" in res.stderr, res.output
    res = _invoke(["jobs", "--endpoint", "chat"], redis_url, prefix)
    assert res.exit_code == 0 and "could not be checked" not in res.stderr, res.output


def test_cancel_workload_of_an_ended_workload_says_it_had_ended(r, keys, settings, redis_url, prefix):
    fleet = load_fleet(FLEET_TOML)
    wid = submit_workload(r, keys, fleet, load_workload(SYNTH, fleet), settings)
    res = _invoke(["cancel-workload", wid], redis_url, prefix)
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["cancelled"] > 0 and out["already_ended"] is None, res.output
    assert res.stderr == ""
    res = _invoke(["cancel-workload", wid], redis_url, prefix)
    ended_text = _utc(float(r.hget(keys.workload(wid), "finished_at")))
    assert res.exit_code == EXIT_ALREADY_ENDED, res.output
    assert json.loads(res.stdout) == {"cancelled": 0, "cancel_requested": 0, "already_ended": "cancelled"}
    assert f"workload {wid} had already ended (cancelled at {ended_text}): nothing to cancel" in res.stderr
    assert cancel_workload(r, keys, wid) == {"cancelled": 0, "cancel_requested": 0}  # its documented answer


def test_cancel_workload_of_a_failed_workload_stops_what_still_goes_then_says_it_had_ended(r, keys, settings,
                                                                                          redis_url, prefix):
    steps = [{"name": "a", "endpoint": "embed", "service_s": 10}, {"name": "x", "endpoint": "embed", "service_s": 10}]
    wid = submit_workload(r, keys, load_fleet(FLEET_TOML), {"name": "wl", "priority": "LOW", "retry_budget": 0,
                                                            "steps": steps}, settings)
    failed = json.loads(r.hget(keys.workload(wid), "steps"))["a"]
    r.zrem(keys.queue("LOW"), failed)  # step a failed as its GPU worker would end it (no retry left)
    r.hset(keys.job(failed), "state", "failed")
    assert advance_workloads(r, keys)["failed"] == 1
    res = _invoke(["cancel-workload", wid], redis_url, prefix)  # x, independent of a, still went on
    assert res.exit_code == 0 and json.loads(res.stdout) == {"cancelled": 1, "cancel_requested": 0,
                                                             "already_ended": "failed"}, res.output
    assert f"workload {wid} had already failed at " in res.stderr and "still going were cancelled" in res.stderr
    failed_text = _utc(float(r.hget(keys.workload(wid), "failed_at")))
    assert f"workload {wid} had already failed at {failed_text}" in res.stderr, res.stderr
    # it finished later (its last step cancelled just now), but both answers give when it failed (a
    # helper's report: the second named its finish time after "failed at")
    r.hset(keys.workload(wid), "finished_at", float(r.hget(keys.workload(wid), "failed_at")) + 6.0)
    res = _invoke(["cancel-workload", wid], redis_url, prefix)
    assert res.exit_code == EXIT_ALREADY_ENDED and f"had already ended (failed at {failed_text})" in res.stderr, \
        res.output


def test_cancel_many_by_ids_or_by_filters(r, keys, settings, redis_url, prefix):
    """An operator cancelling every queued LOW job of one endpoint ran `makespan cancel` once
    per id from a `jobs` listing: ids and filters (as `jobs` takes them) cancel many at once."""
    _publish_fleet(r, keys)
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    low = [prod.submit({"endpoint": "chat", "service_s": 5, "priority": "LOW"}).id for _ in range(2)]
    high = prod.submit({"endpoint": "chat", "service_s": 5, "priority": "HIGH"}).id
    other = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "LOW"}).id
    res = _invoke(["cancel", "--endpoint", "chat", "--priority", "LOW", "--dry-run"], redis_url, prefix)
    assert res.exit_code == 0 and sorted(line.split()[0] for line in res.stdout.splitlines()) == sorted(low)
    assert "2 jobs would be cancelled" in res.stderr and r.hget(keys.job(low[0]), "state") == "queued"
    res = _invoke(["cancel", "--endpoint", "chat", "--priority", "LOW"], redis_url, prefix)
    assert res.exit_code == 0 and sorted(res.stdout.split()) == sorted([*low, "cancelled", "cancelled"]), res.output
    assert "2 cancelled" in res.stderr
    assert [r.hget(keys.job(j), "state") for j in (*low, high, other)] == ["cancelled", "cancelled", "queued", "queued"]
    res = _invoke(["cancel", high, low[0], "nope"], redis_url, prefix)  # ids: one unknown, one ended already
    assert res.exit_code == 2, res.output
    assert res.stdout.splitlines() == [f"{high} cancelled", f"{low[0]} already cancelled"]
    assert "nope unknown" in res.stderr and "1 already cancelled, 1 cancelled, 1 unknown" in res.stderr
    res = _invoke(["cancel", *low], redis_url, prefix)  # every one had ended: nothing cancelled, as one id's exit 5
    assert res.exit_code == 5 and "2 already cancelled" in res.stderr, res.output
    for argv, words in ((["cancel"], "give a job id, or filters"), (["cancel", other, "--endpoint", "embed"],
                                                                   "not both"),
                        (["cancel", "--state", "completed"], "an ended job has nothing to cancel")):
        res = _invoke(argv, redis_url, prefix)
        assert res.exit_code == 2 and words in res.output, res.output
    assert r.hget(keys.job(other), "state") == "queued"


def test_result_of_a_job_without_a_function_says_so_and_lists_its_request_records(r, keys, settings, redis_url,
                                                                                   prefix):
    """`makespan result` of a plain job or a workload's request step printed a bare `null`, as a
    function that returned None does (a helper moving an eval pipeline could not read its
    judge's answers back): a note says it runs no function, and `--requests` prints its
    request records as the GPU worker stored them."""
    job = Producer(r, keys, load_fleet(FLEET_TOML), settings).submit({"endpoint": "chat", "service_s": 5})
    records = [json.dumps({"t0": 1.0, "t1": 1.5, "ms": 500.0, "ok": True, "answer": f"answer {i}"}) for i in range(2)]
    r.rpush(keys.requests(job.id), *records)  # what workers/requests.py records for a request step
    r.hset(keys.job(job.id), mapping={"state": "completed", "finished_at": time.time()})
    res = _invoke(["result", job.id], redis_url, prefix)
    assert res.exit_code == 0 and res.stdout.strip() == "null", res.output
    assert f"note: job {job.id} runs no workload function" in res.stderr
    assert f"its 2 request records: `makespan result {job.id} --requests`" in res.stderr
    res = _invoke(["result", job.id, "--requests"], redis_url, prefix)
    assert res.exit_code == 0 and res.stdout.splitlines() == records, res.output
    res = _invoke(["result", "no-such-job", "--requests"], redis_url, prefix)
    assert res.exit_code == 2 and "error:" in res.stderr, res.output


def test_every_command_that_prints_json_takes_json(r, keys, settings, redis_url, prefix):
    """A script that adds --json to every command broke on workload-status, cancel-workload
    and result ("No such option: --json"), which print JSON already; status took it."""
    fleet = load_fleet(FLEET_TOML)
    wid = submit_workload(r, keys, fleet, load_workload(SYNTH, fleet), settings)
    res = _invoke(["workload-status", wid, "--json"], redis_url, prefix)
    assert res.exit_code == 0 and json.loads(res.stdout)["id"] == wid, res.output
    res = _invoke(["cancel-workload", wid, "--json"], redis_url, prefix)
    assert res.exit_code == 0 and json.loads(res.stdout)["already_ended"] is None, res.output
    job = Producer(r, keys, fleet, settings).submit({"endpoint": "chat", "service_s": 5})
    r.hset(keys.job(job.id), mapping={"state": "completed", "finished_at": time.time()})
    res = _invoke(["result", job.id, "--json"], redis_url, prefix)
    assert res.exit_code == 0 and json.loads(res.stdout) is None, res.output


def test_result_json_of_a_failed_cancelled_or_unfinished_job_prints_one_json_object(r, keys, settings, redis_url,
                                                                                      prefix):
    """`makespan result ID --json` of a job that failed printed nothing on stdout, only text on
    stderr (workload-author helper): a script reading stdout got no JSON. Exit codes stay."""
    from makespan.results import encode_error

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    raised, cancelled, waiting = (prod.submit({"endpoint": "chat", "service_s": 5}).id for _ in range(3))
    r.hset(keys.job(raised), mapping={"state": "failed", "finished_at": time.time(), "fn": "f",
                                      "reason": "execute: ValueError"})
    r.set(keys.result(raised), encode_error("ValueError", "", "Traceback ...\nValueError\n", 2))
    r.hset(keys.job(cancelled), mapping={"state": "cancelled", "finished_at": time.time(), "reason": "by a user"})
    res = _invoke(["result", raised, "--json"], redis_url, prefix)
    assert res.exit_code == 1 and json.loads(res.stdout) == {
        "job": raised, "state": "failed",
        "error": {"type": "ValueError", "message": "", "traceback": "Traceback ...\nValueError\n", "attempt": 2}}
    assert "ValueError (no message)" in res.stderr, res.stderr
    res = _invoke(["result", cancelled, "--json"], redis_url, prefix)
    assert res.exit_code == 1 and json.loads(res.stdout) == {"job": cancelled, "state": "cancelled",
                                                             "reason": "by a user"}, res.output
    res = _invoke(["result", waiting, "--json", "--no-wait"], redis_url, prefix)
    assert res.exit_code == 4 and json.loads(res.stdout) == {"job": waiting, "state": "queued",
                                                             "reason": "not finished"}, res.output
    res = _invoke(["result", waiting, "--no-wait"], redis_url, prefix)
    assert res.exit_code == 4 and res.stdout == "", res.output
    res = _invoke(["result", "no-such-job", "--json"], redis_url, prefix)
    assert res.exit_code == 2 and json.loads(res.stdout)["state"] is None, res.output
    assert "no-such-job" in json.loads(res.stdout)["reason"]
