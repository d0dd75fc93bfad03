"""Workload functions end to end: real planner and GPU worker processes that load
``tests.workloads.fns`` (``--workloads``), real endpoint processes over HTTP, results
and errors through :func:`makespan.connect`'s client."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

import makespan
from makespan.keys import Keys
from makespan.telemetry import read_span_file
from makespan.live import LiveSystem, delete_prefix
from makespan.models import load_fleet
from makespan.redis_conn import connect
from tests.live import all_events, flower_receives_events, stop_checked, wait_for

FLEET = Path(__file__).with_name("fleet.toml").resolve()


@pytest.fixture(scope="module")
def marks(tmp_path_factory):
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def live(redis_url, tmp_path_factory, marks):
    """One live system for the module (its own key prefix): planner + GPU worker with
    the test functions, a 1,000-byte result limit and a 0.5 s cancel grace period."""
    prefix = f"mst-fn-{uuid.uuid4().hex[:8]}"
    settings = makespan.settings.Settings(
        redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=3.0, heartbeat_s=0.5,
        batch_wait_s=0.02, planner_tick_s=0.05, workload_modules="tests.workloads.fns", result_max_bytes=1000,
        cancel_grace_s=0.5)
    system = LiveSystem(FLEET, load_fleet(FLEET), settings, tmp_path_factory.mktemp("logs"), observer=False,
                        extra_env={"MAKESPAN_TEST_MARK_DIR": str(marks)})
    system.start()
    client = makespan.connect(redis_url, key_prefix=prefix)
    wait_for(lambda: client.r.exists(client.keys.fn_live("add")), 30, "the worker to publish its functions")
    wait_for(lambda: client.r.exists(client.keys.fleet_version), 30, "the planner to publish the fleet")
    yield system, client
    stop_checked(system)
    r = connect(redis_url)
    delete_prefix(r, Keys(prefix))
    r.close()


def _own_system(settings, tmp_path: Path):
    """(settings, marks folder, started LiveSystem) of a test that kills or pauses its own
    GPU worker: the test functions loaded, their marks written under ``tmp_path/marks``."""
    marks = tmp_path / "marks"
    marks.mkdir()
    s = replace(settings, workload_modules="tests.workloads.fns")
    system = LiveSystem(FLEET, load_fleet(FLEET), s, tmp_path / "logs", observer=False,
                        extra_env={"MAKESPAN_TEST_MARK_DIR": str(marks)})
    system.start()
    return s, marks, system


def _marks(marks: Path, job, what: str) -> list[int]:
    path = marks / f"{job.id}.{what}"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _no_leases(client) -> bool:
    return client.r.zcard(client.keys.leases) == 0


def test_submit_returns_the_functions_result_with_its_context(live):
    _, client = live
    job = client.submit("add", 2, 3, priority="HIGH")
    out = job.result(timeout_s=60)
    assert out["sum"] == 5 and out["attempt"] == 1 and out["priority"] == "HIGH"
    assert len(out["gpus"]) == 1 and out["cuda"] == out["gpus"][0]
    assert out["url"] is None  # a simulated endpoint has no server
    st = job.status()
    assert st["state"] == "completed" and st["attempts"] == st["result_attempt"] == 1  # not attempts 0 beside 1
    assert client.job(job.id).result(timeout_s=1) == out  # by id, from another handle


def test_an_exception_comes_back_with_its_type_message_and_traceback(live):
    _, client = live
    job = client.submit("boom", "the card is missing")
    with pytest.raises(makespan.WorkloadError) as err:
        job.result(timeout_s=60)
    assert err.value.error_type == "ValueError" and err.value.message == "the card is missing"
    assert "raise ValueError(message)" in err.value.traceback and err.value.attempt == 1
    assert job.status()["state"] == "failed"


def test_a_result_over_the_limit_fails_the_job_and_says_where_to_put_it(live):
    import subprocess
    import sys

    system, client = live
    job = client.submit("big", 5000)
    with pytest.raises(makespan.WorkloadError) as err:
        job.result(timeout_s=60)
    assert err.value.error_type == "makespan.ResultTooLarge"
    assert "over the limit of 1000 bytes" in err.value.message and "return a reference" in err.value.message
    res = subprocess.run([sys.executable, "-m", "makespan.cli", "result", job.id], env=system._env(),
                         capture_output=True, text=True, timeout=60)
    # no traceback (the worker's own error): the reason once, on the job's line
    assert res.returncode == 1 and res.stdout == "" and res.stderr.count("over the limit") == 1, res.stderr
    assert client.submit("big", 100).result(timeout_s=60) == "x" * 100


def test_cancel_mid_run_reaches_the_function_and_ends_cancelled(live, marks):
    _, client = live
    job = client.submit("wait_for_cancel")
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    wait_for(lambda: job.status().get("progress_total") == 10.0, 10, "its progress to show")
    assert job.status()["progress_note"] == "waiting"
    assert job.cancel() == "cancel_requested"
    assert job.wait(timeout_s=30) == "cancelled"
    assert _marks(marks, job, "saw_cancel") == [1]
    with pytest.raises(makespan.JobCancelled):
        job.result(timeout_s=1)
    wait_for(lambda: _no_leases(client), 10, "its lease to be released")


def test_a_job_cancelled_mid_execute_keeps_its_attempt(live, marks):
    """A running function is cancelled: its status keeps the one attempt it made (found by
    a review: ``attempts`` went from 1 back to 0 once the job was cancelled)."""
    _, client = live
    job = client.submit("wait_for_cancel")
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    st = job.status()
    assert st["state"] == "running" and st["attempts"] == 1, st
    assert job.cancel() == "cancel_requested"
    assert job.wait(timeout_s=30) == "cancelled"
    st = job.status()
    assert (st["state"], st["attempts"], st["reclaimed_attempts"]) == ("cancelled", 1, 0), st
    wait_for(lambda: _no_leases(client), 10, "its lease to be released")


def test_status_of_a_running_job_names_its_gpus_and_its_phase(live, marks):
    """job.status() and ``makespan status ID`` of a job in its execute phase say which GPUs
    its lease holds and which phase runs (and which are done), from the lease record and
    the phase markers; a finished job has none of them. Before, neither showed GPUs or a
    phase. (found by a review, 2026-12-05; fails on the code before its fix)"""
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    _, client = live
    job = client.submit("wait_for_cancel")
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    st = job.status()
    assert st["state"] == "running" and st["phase"] == "execute", st
    assert st["phases_done"] == ["evict", "start_endpoint"]
    [gpu] = st["gpus"]  # the function's one GPU: its GPU key names this job's lease
    assert client.r.get(client.keys.gpu(gpu)).split(":")[0] == st["lease"]
    # and the host they are on (reliability review: a real GPU's UUID does not name it)
    assert st["host"] == client.fleet().host_of(gpu)
    env = {"MAKESPAN_REDIS_URL": client.settings.redis_url, "MAKESPAN_KEY_PREFIX": client.keys.prefix}
    res = CliRunner().invoke(cli_app, ["status", job.id], env=env)
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert (shown["gpus"], shown["host"], shown["phase"], shown["phases_done"]) == (
        [gpu], st["host"], "execute", ["evict", "start_endpoint"])
    assert job.cancel() == "cancel_requested"
    assert job.wait(timeout_s=30) == "cancelled"
    ended = job.status()
    assert not {"phase", "phases_done"} & set(ended)
    assert (ended["gpus"], ended["host"]) == ([gpu], st["host"])  # where it ran stays on the ended job
    wait_for(lambda: _no_leases(client), 10, "its lease to be released")


def test_ctx_cancelled_reads_as_whether_it_is_set(live, marks):
    """``while not ctx.cancelled:`` runs until the cancel (found by a new-user check: a plain
    threading.Event is always true, so the loop ended at once and the job completed)."""
    _, client = live
    job = client.submit("loop_until_cancelled")
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    assert job.status()["state"] in ("leased", "running")  # still looping: not ended at once
    assert job.cancel() == "cancel_requested"
    assert job.wait(timeout_s=30) == "cancelled"
    assert _marks(marks, job, "saw_cancel") == [1] and _marks(marks, job, "ran_to_the_end") == []
    wait_for(lambda: _no_leases(client), 10, "its lease to be released")


def test_a_function_that_ignores_cancel_is_stopped_after_the_grace_period(live, marks):
    _, client = live
    job = client.submit("ignore_cancel")
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    job.cancel()
    assert job.wait(timeout_s=30) == "cancelled"
    reason = job.status()["reason"]
    assert "ignore_cancel did not stop within the 0.5 s grace period after ctx.cancelled was set and was stopped" \
        in reason and "returned" not in reason
    time.sleep(0.3)
    assert _marks(marks, job, "ran_to_the_end") == []


def test_a_function_blocked_in_a_sleep_that_ignores_cancel_is_not_said_to_have_returned(live, marks):
    """``time.sleep(60)`` ignoring the cancel (found by a new-user trial: the reason said
    ``workload ... returned`` though the function was still sleeping when it was stopped)."""
    _, client = live
    job = client.submit("sleep_ignoring_cancel", 90)
    wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")
    job.cancel()
    assert job.wait(timeout_s=60) == "cancelled"  # long before the 90 s sleep ends
    reason = job.status()["reason"]
    assert "sleep_ignoring_cancel did not stop within the 0.5 s grace period" in reason, reason
    assert "blocked outside Python code" in reason and "returned" not in reason, reason
    assert _marks(marks, job, "ran_to_the_end") == []
    wait_for(lambda: _no_leases(client), 10, "its lease to be released")


def test_retries_follow_the_definition_with_backoff(live, marks):
    system, client = live
    job = client.submit("flaky", 2)  # retries=2: attempts 1 and 2 fail, 3 succeeds
    assert job.result(timeout_s=60) == {"attempt": 3}
    # each retry is a WARNING line of the GPU worker (an SRE found none in any log)
    worker_log = "".join(proc.log_path.read_text() for proc in system.procs if proc.name.startswith("gpu"))
    assert f"job {job.id} (workload flaky, NORMAL): attempt 1 raised: execute: " in worker_log
    assert "; retry 2 of 2 in " in worker_log
    assert _marks(marks, job, "ran") == [1, 2, 3]
    evs = [e for e in all_events(client.r, client.keys) if e.get("job") == job.id and e["kind"] == "retry_scheduled"]
    assert [e["attempt"] for e in evs] == [1, 2]
    waits = [e["not_before"] - e["ts"] for e in evs]
    assert waits[0] == pytest.approx(0.2, abs=0.1) and waits[1] == pytest.approx(0.4, abs=0.1)  # 0.2 × 2^n
    failing = client.submit("flaky", 5)
    with pytest.raises(makespan.WorkloadError) as err:
        failing.result(timeout_s=60)
    assert err.value.attempt == 3 and "attempt 3 fails" in err.value.message


def test_the_hint_for_an_unknown_name_needs_a_close_function_not_only_the_same_module():
    from makespan.registry import closest_name

    assert closest_name("mymodule.nope", ["mymodule.slow", "gpu_jobs.shout"]) is None  # was 'mymodule.slow'
    assert closest_name("mymodule.slwo", ["mymodule.slow", "gpu_jobs.shout"]) == "mymodule.slow"
    assert closest_name("shout", ["mymodule.slow", "gpu_jobs.shout"]) == "gpu_jobs.shout"  # the module left out
    assert closest_name("gpu_job.shout", ["gpu_jobs.shout"]) == "gpu_jobs.shout"


def test_an_unknown_workload_name_is_rejected_and_nothing_is_written(live):
    _, client = live
    before = client.r.get(client.keys.seq)
    with pytest.raises(makespan.ValidationError) as err:
        client.submit("no_such_workload", 1)
    assert "no live GPU worker registered this workload" in str(err.value) and "add" in str(err.value)
    assert "did you mean" not in str(err.value)  # nothing live is close to it
    with pytest.raises(makespan.ValidationError, match="did you mean 'add'"):  # a misspelt name gets the hint
        client.submit("addd", 1, 2)
    with pytest.raises(makespan.ValidationError):
        client.submit("add", float("nan"), 1)  # not JSON
    with pytest.raises(makespan.ValidationError):
        client.submit("add", "\ud800", 1)  # a lone surrogate
    assert client.r.get(client.keys.seq) == before


def test_arguments_that_do_not_bind_are_refused_at_submit_and_nothing_is_written(live):
    _, client = live
    before = client.r.get(client.keys.seq)
    for args, kwargs, message in [((1,), {}, "missing a required argument: 'b'"),
                                  ((1, 2, 3), {}, "too many positional arguments"),
                                  ((1,), {"c": 2}, "missing a required argument: 'b'"),
                                  ((1, 2), {"c": 3}, "unexpected keyword argument 'c'")]:
        with pytest.raises(makespan.ValidationError) as err:
            client.submit("add", *args, **kwargs)
        assert message in str(err.value) and "add(a, b) (makespan passes its ctx first" in str(err.value)
        assert f"this submit gave {len(args)} positional argument" in str(err.value)
        assert "{'args'" not in str(err.value)  # not a Python dict's repr
    assert client.r.get(client.keys.seq) == before
    assert client.submit("add", a=1, b=2).result(timeout_s=60)["sum"] == 3  # keywords bind too


def test_a_dag_of_functions_passes_results_to_the_next_step(live):
    _, client = live
    first = client.submit("add", 20, 22)
    second = client.submit("concat", "answer=", first, "!")
    assert json.loads(client.r.hget(client.keys.job(second.id), "deps")) == [first.id]
    out = second.result(timeout_s=60)
    assert out.startswith("answer={") and "'sum': 42" in out and out.endswith("!")
    starts = {e["job"]: e["ts"] for e in all_events(client.r, client.keys)
              if e["kind"] == "phase_start" and e.get("phase") == "execute" and e.get("job") in (first.id, second.id)}
    assert starts[first.id] < starts[second.id]


def test_a_job_without_a_function_passed_as_an_argument_is_refused_at_submit(live):
    """A plain job stores no result: passing it was accepted, the dependant waited for it
    and then failed in execute saying the result had 'expired' (a user's report)."""
    _, client = live
    plain = client.submit_job("sim", service_s=1)  # the simulated endpoint 'add' runs on: no process left
    assert plain.result(timeout_s=60) is None  # it completed, with no result
    before = client.r.get(client.keys.seq)
    with pytest.raises(makespan.ValidationError) as err:
        client.submit("concat", "x", plain, "!")
    assert err.value.field == "job.args[1]" and "runs no workload function" in str(err.value), str(err.value)
    with pytest.raises(makespan.ValidationError, match=r"job\.kwargs\.b: .*depends_on"):
        client.submit("add", 1, b=plain)
    assert client.r.get(client.keys.seq) == before  # nothing written


def test_a_hand_written_result_reference_and_an_expired_result_are_refused_at_submit(live):
    """``--args '[{"__makespan_result__": ID}]'`` was taken as job ID's result with no
    dependency added (it could run before that job ended), and a Job whose result had
    expired was accepted, then failed at its run (workload-author helper): both are refused
    at submit, nothing written; a Job handle still passes its result."""
    _, client = live
    first = client.submit("add", 1, 2)
    assert first.result(timeout_s=60)["sum"] == 3
    before = client.r.get(client.keys.seq)
    with pytest.raises(makespan.ValidationError, match=r"job\.args\[1\]: .*reserved for a job passed as an argument"):
        client.submit("concat", "x", {"__makespan_result__": first.id}, "!")
    with pytest.raises(makespan.ValidationError, match=r"job\.kwargs\.b: .*reserved"):
        client.submit("add", 1, b={"__makespan_result__": "no-such-job"})
    keyed = client.submit("concat", "x", first, "!", idempotency_key=f"ref-{first.id}")
    assert keyed.result(timeout_s=60).startswith("x{")
    with pytest.raises(makespan.ValidationError, match=r"job\.args\[0\]: .*its value a job id"):
        client.submit("concat", {"__makespan_result__": 5})
    ttl_ms = client.r.pttl(client.keys.result(first.id))
    assert ttl_ms > 0
    saved = client.r.get(client.keys.result(first.id))
    client.r.delete(client.keys.result(first.id))  # as MAKESPAN_RESULT_TTL_S would
    try:
        before = client.r.get(client.keys.seq)
        with pytest.raises(makespan.ValidationError, match=r"job\.args\[1\]: .*completed, but its result is gone"):
            client.submit("concat", "x", first, "!")
        assert client.r.get(client.keys.seq) == before  # nothing written
        # a repeated idempotency key still returns its job (a verifier: it was refused the same way)
        again = client.submit("concat", "x", first, "!", idempotency_key=f"ref-{first.id}")
        assert again.id == keyed.id and not again.created
    finally:
        client.r.set(client.keys.result(first.id), saved, px=ttl_ms)


def test_requests_and_a_helper_endpoint_started_and_cleared(live):
    _, client = live
    answers = client.submit("prompts", ["a", "b", "c"]).result(timeout_s=90)
    assert len(answers) == 3 and all(a.startswith("completion ") and a.endswith(" from gen") for a in answers)
    job = client.submit("gen_and_embed", ["x", "y"])
    assert client.r.hget(client.keys.job(job.id), "helpers") == '["embed"]'  # placed with the job by the plan
    out = job.result(timeout_s=90)
    assert out["urls"] == ["embed", "gen"] and out["dims"] == [8, 8] and len(out["texts"]) == 2
    # the run's request records hold both ctx.requests calls (each call used to drop the ones before)
    assert client.r.llen(client.keys.requests(job.id)) == 4
    # the plan priced the helper's cold start (10 s) after gen's own transition (0 warm, 10 cold):
    # planned_s (plan end - lease time) is above service + gen's transition, by 10 s less the
    # workload seconds between the plan and the lease (at time scale 0.01: 1 s per 10 ms)
    leased = next(e for e in all_events(client.r, client.keys) if e["kind"] == "leased" and e.get("job") == job.id)
    service_s = float(client.r.hget(client.keys.job(job.id), "service_s"))
    assert leased["planned_s"] > service_s + (10 if leased["load"] == "cold_start" else 0), leased
    from makespan.workers.drivers.registry import list_instances

    assert [i.endpoint for i in list_instances(client.r, client.keys) if i.endpoint == "embed"] == []


def test_asyncio_twins(live):
    _, client = live
    job = client.submit("add", 1, 2)
    assert asyncio.run(job.result_async(timeout_s=60))["sum"] == 3
    assert asyncio.run(job.wait_async(timeout_s=1)) == "completed"

    async def from_a_handler():  # as an async web handler would: submit, read, cancel, without blocking the loop
        other = await client.submit_async("add", 2, 3, priority="HIGH")
        assert (await other.status_async())["priority"] == "HIGH"
        with pytest.raises(makespan.ValidationError, match="do not match add"):  # the same checks as submit()
            await client.submit_async("add", 1, 2, 3)
        assert (await job.cancel_outcome_async()).already_ended
        return other, await other.result_async(timeout_s=60), await job.cancel_async()

    other, result, cancelled = asyncio.run(from_a_handler())
    assert result["sum"] == 5 and cancelled == "completed" and other.created


def test_learned_service_time_converges_on_a_fixed_execute_time(live):
    """fixed_time sleeps 0.1 wall s = 10 workload s at time scale 0.01; its prior is 5 s.
    After 20 runs the planning estimate's error is at most 10 % (p50 of the last 10)."""
    _, client = live
    errors = []
    for _ in range(20):
        job = client.submit("fixed_time", 0.1)
        planned = float(client.r.hget(client.keys.job(job.id), "service_s"))
        assert client.r.hget(client.keys.job(job.id), "service_estimated") == "1"
        assert job.status()["service_estimated"] is True  # a flag in the status JSON, as cancel_requested
        job.result(timeout_s=60)
        rec = json.loads(client.r.get(client.keys.result(job.id)))
        actual = rec["execute_s"] / 0.01
        errors.append(abs(actual - planned) / actual)
    print(f"estimate error: first {errors[0]:.3f}, p50 of runs 11-20 {statistics.median(errors[-10:]):.4f}")
    assert errors[0] > 0.3  # the prior (5 s) against about 10 s
    assert statistics.median(errors[-10:]) <= 0.10, errors


def test_a_fleet_that_differs_from_the_published_one_is_refused(live, tmp_path):
    system, client = live
    other = tmp_path / "other.toml"
    other.write_text(FLEET.read_text().replace("slots = 4", "slots = 5"))
    mismatched = makespan.connect(client.settings.redis_url, key_prefix=client.keys.prefix, fleet=other)
    with pytest.raises(makespan.ValidationError) as err:
        mismatched.submit("add", 1, 1)
    assert "differs from the fleet the planner published" in str(err.value)
    same = makespan.connect(client.settings.redis_url, key_prefix=client.keys.prefix, fleet=FLEET)
    assert same.submit("add", 1, 1).result(timeout_s=60)["sum"] == 2


def test_sigkill_mid_run_runs_again_and_stores_one_result(settings, r, keys, tmp_path):
    """SIGKILL of the GPU worker while the function runs: the lease expires, the job runs
    again as attempt 2 on a new worker, and the stored result is attempt 2's."""
    s, marks, system = _own_system(settings, tmp_path)
    try:
        client = makespan.connect(s.redis_url, key_prefix=s.key_prefix)
        wait_for(lambda: client.r.exists(client.keys.fn_live("slow_first")), 30, "the functions to be published")
        job = client.submit("slow_first", 30)
        wait_for(lambda: _marks(marks, job, "ran"), 60, "the first attempt to start")
        assert system.kill("gpu-")
        system.start_gpu_worker("host-w", 1)
        assert job.result(timeout_s=90) == {"attempt": 2}
        assert _marks(marks, job, "ran") == [1, 2]
        assert r.hget(keys.job(job.id), "result_attempt") == "2"
        assert int(r.hget(keys.job(job.id), "attempts")) == 1
        assert json.loads(r.get(keys.result(job.id)))["attempt"] == 2
    finally:
        stop_checked(system)



def test_a_job_submitted_from_the_cli_is_one_trace_with_its_root_span(settings, tmp_path):
    """``makespan submit WORKLOAD`` gives the job a traceparent: its phase spans and its
    ``makespan`` root span (ended by the GPU worker) share one trace."""
    import subprocess
    import sys

    trace_file = tmp_path / "spans.jsonl"
    env = {"OTEL_TRACES_EXPORTER": "file", "MAKESPAN_TRACE_FILE": str(trace_file)}
    s = replace(settings, workload_modules="tests.workloads.fns")
    system = LiveSystem(FLEET, load_fleet(FLEET), s, tmp_path / "logs", observer=False, extra_env=env)
    system.start()
    try:
        client = makespan.connect(s.redis_url, key_prefix=s.key_prefix)
        wait_for(lambda: client.r.exists(client.keys.fn_live("add")), 30, "the functions to be published")
        out = subprocess.run([sys.executable, "-m", "makespan.cli", "submit", "add", "--args", "[4, 5]", "-q"],
                             env={**system._env(), **env}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job = client.job(out.stdout.strip())
        # read before retention compacts the record; on a loaded machine the job may already
        # be done and compacted by now, and then only the spans carry the trace id
        tp = client.r.hget(client.keys.job(job.id), "traceparent")
        assert job.result(timeout_s=60)["sum"] == 9
        res = subprocess.run([sys.executable, "-m", "makespan.cli", "result", job.id], env=system._env(),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and json.loads(res.stdout)["sum"] == 9, res.stderr
        assert tp is None or tp.startswith("00-")

        def spans():
            rows = read_span_file(trace_file)
            return [x for x in rows if x["attributes"].get("makespan.job_id") == job.id]
        wait_for(lambda: any(x["name"] == "makespan" for x in spans()), 30, "the job's root span")
        mine = spans()
        trace_ids = {x["trace_id"] for x in mine}
        assert len(trace_ids) == 1 and (tp is None or trace_ids == {tp.split("-")[1]})
        assert {"makespan", "execute_workload"} <= {x["name"] for x in mine}
    finally:
        stop_checked(system)


def test_makespan_result_prints_a_workload_error_and_exits_1(live):
    import subprocess
    import sys

    system, client = live
    job = client.submit("boom", "no cards")
    job.wait(timeout_s=60)
    res = subprocess.run([sys.executable, "-m", "makespan.cli", "result", job.id], env=system._env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "ValueError: no cards" in res.stderr and "Traceback" in res.stderr


def test_progress_reaches_flower_while_the_function_runs(live, marks, tmp_path):
    """ctx.progress sends a Celery task-progress event: Flower shows the execute task in
    state PROGRESS with the progress as its result while the function runs."""
    import subprocess
    import sys

    import httpx

    from makespan.redis_conn import free_port

    system, client = live
    port = free_port()
    auth = ("ops", "pw-test")
    flower = subprocess.Popen([sys.executable, "-m", "celery", "-A", "makespan.workers.tasks:celery", "flower",
                               f"--port={port}", "--address=127.0.0.1", f"--basic-auth={auth[0]}:{auth[1]}",
                               "--persistent=False"], env=system._env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        def tasks():
            try:
                resp = httpx.get(f"http://127.0.0.1:{port}/api/tasks", auth=auth, timeout=3.0)
                return resp.json() if resp.status_code == 200 else None
            except httpx.HTTPError:
                return None
        wait_for(lambda: tasks() is not None, 90, "Flower to answer")  # bounds a hang: a start on a loaded host
        # Flower answers HTTP before its event receiver (a thread of its own) has subscribed,
        # and Celery's events are published once, to the subscribers of that moment: a task
        # sent before it subscribes is missed for good (its PROGRESS, and its name). A worker
        # heartbeat (every 2 s) that Flower counted shows that the receiver is in place.
        wait_for(lambda: flower_receives_events(port, auth), 60, "Flower's event receiver to see a worker heartbeat")
        job = client.submit("wait_for_cancel")
        wait_for(lambda: _marks(marks, job, "started"), 60, "the function to start")

        def progressing():
            return [t for t in (tasks() or {}).values()
                    if t.get("state") == "PROGRESS" and job.id in str(t.get("result"))]
        found = wait_for(progressing, 30, "Flower to show the task's progress")
        progress = json.loads(found[0]["result"])
        assert progress == {"job_id": job.id, "done": 1.0, "total": 10.0, "note": "waiting"}
        assert found[0]["name"] in ("makespan.execute", "makespan.warm_job")
        job.cancel()
        assert job.wait(timeout_s=30) == "cancelled"
    finally:
        flower.terminate()
        try:
            flower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            flower.kill()


def test_a_worker_paused_past_its_lease_ttl_skips_the_side_effect_when_it_resumes(settings, r, keys, tmp_path):
    """SIGSTOP of the GPU worker while its function runs, for longer than the lease TTL: the
    planner reclaims the lease and the job runs again. On SIGCONT the first run's function
    ended its work during the pause and checks ``ctx.cancelled`` before its side effect: it
    read False (the heartbeat had not yet asked Redis) and did it a second time (breaker
    check). The lease's local deadline has passed: it reads True, reason ``lease_lost``."""
    s, marks, system = _own_system(settings, tmp_path)
    paused = []
    try:
        client = makespan.connect(s.redis_url, key_prefix=s.key_prefix)
        wait_for(lambda: client.r.exists(client.keys.fn_live("side_effect_after_work")), 30,
                 "the functions to be published")
        job = client.submit("side_effect_after_work", 1.0)
        wait_for(lambda: _marks(marks, job, "ran"), 60, "the first run to start")
        paused = system.kill("gpu-", signal.SIGSTOP)
        assert paused
        # the planner reclaims the lease once its TTL has passed on the Redis clock
        wait_for(lambda: int(r.hget(keys.job(job.id), "attempts") or 0) >= 1, 60, "the lease to be reclaimed")
        system.kill("gpu-", signal.SIGCONT)
        paused = []
        assert job.result(timeout_s=90) == {"attempt": 2}
        assert _marks(marks, job, "side_effect") == [2]  # once: not by the resumed first run
        assert _marks(marks, job, "cancelled") == [1]
        assert (marks / f"{job.id}.why").read_text().split() == ["lease_lost"]
    finally:
        if paused:
            system.kill("gpu-", signal.SIGCONT)
        stop_checked(system)


def test_an_endpoint_that_dies_under_a_function_says_so_and_the_next_job_loads_it_again(live):
    """kill -9 of the endpoint process while a function sends it requests: the job failed
    with ``1 of 1 requests ... failed: ConnectError`` and nothing on the process (llama-swap
    user's check); the reason names the endpoint's process now, and the next job of the
    endpoint loads it again (a cold start) instead of failing on the dead resident one."""
    import os
    import signal

    from makespan.workers.drivers.registry import list_instances

    _, client = live
    job = client.submit("prompts", [f"p{i}" for i in range(4000)])  # 4,000 requests of 5 ms, 4 at a time
    wait_for(lambda: client.r.llen(client.keys.requests(job.id)) > 0 or job.status()["state"] == "running", 90,
             "the function to run")
    [inst] = wait_for(lambda: [i for i in list_instances(client.r, client.keys) if i.endpoint == "gen"], 30,
                      "gen's instance")
    os.kill(inst.pid, signal.SIGKILL)
    with pytest.raises(makespan.WorkloadError) as err:
        job.result(timeout_s=90)
    assert f"endpoint 'gen''s process, pid {inst.pid}, died during the run" in err.value.message, err.value.message
    answers = client.submit("prompts", ["again"]).result(timeout_s=90)
    assert len(answers) == 1 and answers[0].endswith(" from gen"), answers
    starts = [e for e in all_events(client.r, client.keys) if e["kind"] == "phase_end"
              and e.get("phase") == "start_endpoint" and e.get("dead_resident")]
    assert starts, "the next job did not load gen again"
