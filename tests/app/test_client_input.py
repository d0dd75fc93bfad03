"""The client API on input a user may well pass (found by a review, 2026-12-04): each test
fails on the code before its fix. In-process, on the real Redis: the fleet and two
workload definitions are published as a planner and a GPU worker would."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import makespan
from makespan.models import fleet_version, load_fleet
from makespan.registry import WorkloadDef, publish
from makespan.store import JobStore
from tests.conftest import FLEET_TOML


def _two(ctx, a, b=1):
    return a


@pytest.fixture
def client(r, keys, redis_url, prefix):
    fleet = load_fleet(FLEET_TOML)
    r.mset({keys.fleet: fleet.model_dump_json(), keys.fleet_version: fleet_version(fleet)})
    publish(r, keys, [WorkloadDef("tests.two", _two, "embed")], ttl_s=600, holder="test")
    with makespan.connect(redis_url, key_prefix=prefix) as out:
        yield out


def _keys_of(r, prefix) -> set[str]:
    return set(r.scan_iter(f"{prefix}:*", count=1000))


def test_status_of_a_queued_job_the_plan_gave_no_eta(client, r, keys):
    """The planner writes wait_eta '' for a job it gives no ETA (left out of its batch, a
    dependency that ends at an unknown time): status() used to raise ValueError."""
    job = client.submit("tests.two", 1)
    assert JobStore(r, keys).write_wait_reasons("", [job.id, "behind_batch", "position 201 in the NORMAL queue", ""]) == 1
    status = job.status()
    assert (status["state"], status["wait_reason"], status["wait_eta"]) == ("queued", "behind_batch", None)


@pytest.mark.parametrize("form", ["job", "id", "list"])
def test_depends_on_one_job_or_one_id(client, r, keys, form):
    """A lone id used to be split into its characters (the dependant then cancelled with
    "dependency 6 did not complete"); a lone Job raised TypeError."""
    first = client.submit("tests.two", 1)
    value = {"job": first, "id": first.id, "list": [first.id]}[form]
    second = client.submit("tests.two", 2, depends_on=value)
    assert json.loads(r.hget(keys.job(second.id), "deps")) == [first.id]


@pytest.mark.parametrize("value", [5, {"a": 1}, 1.5])
def test_depends_on_of_another_type_is_a_validation_error_and_writes_nothing(client, r, prefix, value):
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError):
        client.submit("tests.two", 1, depends_on=value)
    assert _keys_of(r, prefix) == before


def test_depends_on_none_is_no_dependency(client, r, keys):
    job = client.submit("tests.two", 1, depends_on=None)
    assert r.hget(keys.job(job.id), "deps") in (None, "", "[]")


def test_service_s_past_30_days_is_a_validation_error(client, r, prefix):
    """service_s=1e308 was accepted, and the planner process crashed on it (inf/inf in its
    partition members): nothing was scheduled any more."""
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match="30 days"):
        client.submit("tests.two", 1, service_s=1e308)
    assert _keys_of(r, prefix) == before
    assert client.submit("tests.two", 1, service_s=30 * 24 * 3600.0).status()["service_s"] == 30 * 24 * 3600.0


def test_the_planner_plans_jobs_whose_work_sums_past_float_max():
    """A job queued before the limit (or written by hand) must not crash the planner: the
    partition members' work shares were inf/inf = NaN, and int(NaN) raised."""
    from makespan.planner.api import plan
    from makespan.planner.model import PlanJob
    from makespan.planner.simulator import fleet_state

    state = fleet_state(load_fleet(FLEET_TOML))
    batch = [PlanJob(f"j{i}", "embed", 1.0, 0.0, 1e308, 2, (), seq=i) for i in range(3)]
    assert {a.job_id for a in plan(batch, state, "portfolio").assignments} == {"j0", "j1", "j2"}


@pytest.mark.parametrize("name", ["workload", "endpoint"])
def test_a_name_that_is_not_utf8_is_a_validation_error(client, name):
    with pytest.raises(makespan.ValidationError):
        if name == "workload":
            client.submit("tests.t\ud800wo", 1)
        else:
            client.submit("tests.two", 1, endpoint="em\ud800bed")


def test_a_job_id_that_is_not_utf8_is_not_found(client):
    job = client.job("ab\udcff")
    for call in (job.status, job.cancel, job.wait):
        with pytest.raises(makespan.NotFoundError):
            call()


@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -1.0, "5"])
def test_a_wait_timeout_that_is_not_a_finite_number_is_a_validation_error(client, timeout_s):
    """A NaN deadline never passed: wait(timeout_s=nan) blocked for good."""
    job = client.submit("tests.two", 1)
    with pytest.raises(makespan.ValidationError):
        job.wait(timeout_s=timeout_s)
    with pytest.raises(makespan.ValidationError):
        job.result(timeout_s=timeout_s)


def _cli(redis_url, prefix, *args: str | bytes) -> subprocess.CompletedProcess:
    env = {**os.environ, "MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    return subprocess.run([sys.executable, "-m", "makespan.cli", *args], env=env, capture_output=True, timeout=60)


def test_cli_kwargs_named_like_a_submit_option_exit_2(client, redis_url, prefix):
    out = _cli(redis_url, prefix, "submit", "tests.two", "--args", "[1]", "--kwargs", '{"priority": "HIGH"}')
    assert out.returncode == 2 and b"Traceback" not in out.stderr, out.stderr[-400:]
    assert b"--priority" in out.stderr


def test_cli_submit_of_a_repeated_key_prints_the_jobs_priority(client, redis_url, prefix):
    first = client.submit("tests.two", 1, priority="HIGH", idempotency_key="once")
    out = _cli(redis_url, prefix, "submit", "tests.two", "--args", "[1]", "--priority", "LOW",
               "--idempotency-key", "once")
    assert out.returncode == 0, out.stderr[-400:]
    assert json.loads(out.stdout) == {"id": first.id, "created": False, "priority": "HIGH"}
    assert b"warning: idempotency key 'once' already names job" in out.stderr  # LOW was not used: say so
    assert b"this submit's priority differs from that job's and was not used" in out.stderr, out.stderr
    assert out.stderr.count(b"already names job") == 1, out.stderr  # its own line, not also the producer's log
    again = client.submit("tests.two", 2, idempotency_key="once")
    assert not again.created and again.ignored == ("priority", "args")
    same = _cli(redis_url, prefix, "submit", "tests.two", "--args", "[1]", "--priority", "HIGH",
                "--idempotency-key", "once")
    assert same.returncode == 0 and b"warning" not in same.stderr, same.stderr  # the same request: no warning


def test_cli_submit_at_a_level_index_prints_the_level_name(client, redis_url, prefix):
    out = _cli(redis_url, prefix, "submit", "tests.two", "--args", "[1]", "--priority", "0")
    assert out.returncode == 0, out.stderr[-400:]
    assert json.loads(out.stdout)["priority"] == "CRITICAL"


def test_cli_result_of_an_id_that_is_not_utf8_exits_2(client, redis_url, prefix):
    env = {**os.environ, "MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    out = subprocess.run([sys.executable.encode(), b"-m", b"makespan.cli", b"result", b"ab\xff"], env=env,
                         capture_output=True, timeout=60)
    assert out.returncode == 2 and b"Traceback" not in out.stderr, out.stderr[-400:]



# -- what a submit accepts and what it refuses (a review of the submit paths' input) ----------
def _named(ctx, priority, workload):
    return [priority, workload]


@pytest.fixture
def named(client, r, keys):
    """A workload function whose parameters are named like submit()'s own arguments."""
    publish(r, keys, [WorkloadDef("tests.named", _named, "embed")], ttl_s=600, holder="test")
    return client


def test_a_keyword_argument_named_workload_reaches_the_function_and_an_option_name_says_why(named, r, keys):
    """submit(workload, ...) took a keyword ``workload=`` as its own first argument: a
    TypeError 'got multiple values for argument workload'. A parameter named like an
    option (priority) is taken as the option: the refusal now says to pass it positionally."""
    job = named.submit("tests.named", "HIGH", workload="w")
    assert json.loads(r.hget(keys.job(job.id), "spec"))["kwargs"] == {"workload": "w"}
    with pytest.raises(makespan.ValidationError, match="pass such an argument positionally") as e:
        named.submit("tests.named", workload="w", priority="HIGH")
    assert e.value.field == "args" and "priority" in e.value.reason


@pytest.mark.parametrize("value", [{1: "a"}, [{"x": {None: 1}}], {"ok": {2.5: 1}}, {True: 1}])
def test_a_mapping_key_that_is_not_a_string_is_a_validation_error_and_writes_nothing(client, r, prefix, value):
    """JSON writes the key 1 as "1": the function got {"1": "a"} for {1: "a"} (a KeyError on
    the GPU worker), while a set or bytes were refused at submit."""
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match="mapping keys must be strings") as e:
        client.submit("tests.two", value)
    assert e.value.field == "job.args"
    # where the key is, not the list's type ("(got '<list>')": a user's report)
    assert " at job.args[0]" in str(e.value) and "<list>" not in str(e.value), str(e.value)
    with pytest.raises(makespan.ValidationError, match=r"mapping keys must be strings, .* at job\.kwargs\['b'\]"):
        client.submit("tests.two", 1, b=value)
    assert _keys_of(r, prefix) == before


def test_a_job_inside_a_container_says_only_a_top_level_job_is_replaced(client, r, prefix):
    before = _keys_of(r, prefix)
    inner = client.job("0" * 32)
    with pytest.raises(makespan.ValidationError, match="only as a top-level argument") as e:
        client.submit("tests.two", {"inner": [inner]})
    assert "job.args[0]['inner'][0]: of type Job" in str(e.value), str(e.value)
    assert _keys_of(r, prefix) == before


def test_a_numpy_value_says_how_to_convert_it_and_writes_nothing(client, r, prefix):
    """A numpy scalar or array is refused with a hint (a service developer's report: the
    encoder's own message for np.bool_ reads "Object of type bool is not JSON serializable")."""
    np = pytest.importorskip("numpy")
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match=r"job\.args\[0\]\['ok'\]: of type numpy\.bool.*\.item\(\)"):
        client.submit("tests.two", {"ok": np.bool_(True)})
    with pytest.raises(makespan.ValidationError, match=r"of type numpy\.ndarray.*\.tolist\(\)"):
        client.submit("tests.two", np.arange(3))
    assert _keys_of(r, prefix) == before


def test_a_tuple_argument_arrives_as_a_list(client, r, keys):
    """Documented: arguments are JSON, so a tuple is a JSON array (a list at the function)."""
    job = client.submit("tests.two", (1, 2))
    assert json.loads(r.hget(keys.job(job.id), "spec"))["args"] == [[1, 2]]


def test_depends_on_a_repeated_id_is_one_dependency(client, r, keys, settings):
    """Producer.submit kept [a, a] as written (the client deduplicated it): one dependency."""
    from makespan.producer import Producer

    first = client.submit("tests.two", 1)
    via_client = client.submit("tests.two", 2, depends_on=[first, first.id])
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    via_producer = prod.submit({"endpoint": "embed", "service_s": 5, "depends_on": [first.id, first.id]})
    for job_id in (via_client.id, via_producer.id):
        assert json.loads(r.hget(keys.job(job_id), "deps")) == [first.id]


@pytest.mark.parametrize("unknown", ["nope", "0" * 32, "d" * 100_000])
def test_depends_on_an_unknown_id_is_a_validation_error_and_writes_nothing(client, r, keys, prefix, settings, unknown):
    """It was accepted, and the planner's next tick cancelled the job ("dependency nope did
    not complete"): a typo surfaced as a cancelled job. Checked in the submit script, so a
    dependency cannot vanish between the check and the write."""
    from makespan.producer import Producer

    first = client.submit("tests.two", 1)
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match="no such job") as e:
        client.submit("tests.two", 2, depends_on=[first, unknown])
    assert e.value.field == "job.depends_on.1"
    with pytest.raises(makespan.ValidationError, match="no such job"):
        Producer(r, keys, load_fleet(FLEET_TOML), settings).submit({"endpoint": "embed", "service_s": 5,
                                                                   "depends_on": [unknown]})
    assert _keys_of(r, prefix) == before


def _planner(r, settings, policy="tardiness-portfolio"):
    import dataclasses

    from makespan.workers.planner_worker import PlannerWorker

    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy=policy)
    return PlannerWorker(r, s, load_fleet(FLEET_TOML), dispatch=lambda ctx, queue: None)


@pytest.mark.parametrize("final", ["cancelled", "failed"])
def test_depends_on_a_job_that_ended_without_completing_is_cancelled_by_the_next_tick(client, r, keys, settings,
                                                                                       final):
    """Documented: a dependency that already failed or was cancelled is accepted (a failed
    workload step may still be retried under a new id), and the planner's next tick
    cancels the dependant with the dependency named."""
    first = client.submit("tests.two", 1)
    first.cancel()
    if final == "failed":
        r.hset(keys.job(first.id), "state", "failed")
    second = client.submit("tests.two", 2, depends_on=first)
    w = _planner(r, settings)
    w.token = str(r.incr(keys.planner_fence))  # the planner's cancel is fenced: lead
    w.tick()
    status = second.status()
    assert status["state"] == "cancelled" and status["reason"] == f"dependency {first.id} did not complete"


def test_deadline_s_past_a_year_is_a_validation_error(client, r, prefix):
    """deadline_s=1e308 was accepted, and every CP-SAT solve of the tardiness policy failed
    on it (a due time that is no 64-bit integer) for as long as the job waited."""
    before = _keys_of(r, prefix)
    for deadline_s in (1e308, 365 * 24 * 3600.0 + 1):
        with pytest.raises(makespan.ValidationError, match="365 days") as e:
            client.submit("tests.two", 1, deadline_s=deadline_s)
        assert e.value.field == "job.deadline_s"
    assert _keys_of(r, prefix) == before


def test_the_tardiness_policy_plans_a_job_whose_due_time_is_no_64_bit_integer():
    """A job queued before the limit (or written by hand): the window model passed
    due = int(1e308 − now) to CP-SAT, which refused the model (TypeError in the improver)."""
    from makespan.planner.api import plan
    from makespan.planner.model import PlanJob
    from makespan.planner.simulator import fleet_state

    state = fleet_state(load_fleet(FLEET_TOML))
    batch = [PlanJob(f"j{i}", "embed", 1.0, 0.0, 100.0 + i, 2, (), 1e308 if i % 2 else 5.0, seq=i) for i in range(12)]
    assert {a.job_id for a in plan(batch, state, "tardiness", time_limit_s=2.0).assignments} == {b.id for b in batch}


@pytest.mark.parametrize("options", [
    {"service_s": 30 * 24 * 3600.0}, {"service_s": "5"}, {"delay_s": 1e-300}, {"deadline_s": 365 * 24 * 3600.0},
    {"deadline_s": 1e-300}, {"priority": 0}, {"priority": "low"}, {"priority": 3},
])
def test_the_extremes_a_submit_accepts_are_planned_by_the_next_tick(client, r, keys, settings, options):
    """Each bound is documented (docs/configuration.md, "Jobs"); what is accepted at it must
    not make the planner raise later."""
    job = client.submit("tests.two", 1, **options)
    w = _planner(r, settings)
    w.tick()
    w.tick()
    assert job.status()["state"] in ("queued", "delayed", "leased")


def test_cli_submit_depends_on(client, r, keys, redis_url, prefix):
    """--kwargs '{"depends_on": ...}' was refused with "use --depends-on", an option the CLI
    did not have."""
    first = client.submit("tests.two", 1)
    out = _cli(redis_url, prefix, "submit", "tests.two", "--args", "[2]", "--depends-on", first.id, "-q")
    assert out.returncode == 0, out.stderr[-400:]
    assert json.loads(r.hget(keys.job(out.stdout.decode().strip()), "deps")) == [first.id]
    out = _cli(redis_url, prefix, "submit", "--endpoint", "embed", "--service-s", "5", "--depends-on", first.id,
               "--depends-on", "nope")
    assert out.returncode == 2 and b"Traceback" not in out.stderr, out.stderr[-400:]
    assert b"job.depends_on.1: no such job" in out.stderr


def test_depends_on_past_its_limit_is_a_validation_error_and_writes_nothing(client, r, keys, prefix, settings,
                                                                           monkeypatch):
    """``depends_on`` had no cap: a submit naming 1,000,000 ids was read id by id by the
    submit script and then by the planner. At most ``MAKESPAN_MAX_DEPENDS_ON`` distinct ids
    (a repeated one counts once), refused before any is read, nothing written."""
    import dataclasses

    from makespan.producer import Producer
    from makespan.settings import Settings

    monkeypatch.setenv("MAKESPAN_MAX_DEPENDS_ON", "3")
    assert Settings.from_env().max_depends_on == 3 and Settings().max_depends_on == 1_000
    assert Settings.from_env().to_env()["MAKESPAN_MAX_DEPENDS_ON"] == "3"
    firsts = [client.submit("tests.two", n) for n in range(4)]
    capped = Producer(r, keys, load_fleet(FLEET_TOML), dataclasses.replace(settings, max_depends_on=3))
    at_limit = capped.submit({"endpoint": "embed", "service_s": 5,
                              "depends_on": [firsts[0].id, firsts[1].id, firsts[2].id, firsts[0].id]})
    assert len(json.loads(r.hget(keys.job(at_limit.id), "deps"))) == 3
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match="MAKESPAN_MAX_DEPENDS_ON") as e:
        capped.submit({"endpoint": "embed", "service_s": 5, "depends_on": [job.id for job in firsts]})
    assert (e.value.field, e.value.value) == ("job.depends_on", "4 ids") and "limit of 3" in e.value.reason
    with pytest.raises(makespan.ValidationError, match="MAKESPAN_MAX_DEPENDS_ON"):  # the client reads the variable
        with makespan.connect(settings.redis_url, key_prefix=prefix) as capped_client:
            capped_client.submit("tests.two", 9, depends_on=firsts)
    with pytest.raises(makespan.ValidationError, match="limit of 1000 ") as e:  # the default
        Producer(r, keys, load_fleet(FLEET_TOML), settings).submit(
            {"endpoint": "embed", "service_s": 5, "depends_on": [f"{n:032x}" for n in range(1_000_000)]})
    assert e.value.value == "1000000 ids"
    assert _keys_of(r, prefix) == before


def test_a_job_without_a_workload_function_from_python(client, r, keys, prefix):
    """There was no Python call for a plain job (`makespan submit --endpoint E --service-s S`):
    a new user submitting 10k simulated jobs went through the internal Producer.
    ``client.submit_job`` takes the endpoint and the submit options; bad input writes nothing."""
    first = client.submit_job("embed", service_s=30, priority="HIGH", idempotency_key="plain-1")
    status = first.status()
    assert (status["state"], status["endpoint"], status["priority"], status["service_s"]) == \
        ("queued", "embed", "HIGH", 30.0)
    again = client.submit_job("embed", service_s=30, priority="HIGH", idempotency_key="plain-1")
    assert again.id == first.id and not again.created
    after = client.submit_job("embed", service_s=5, depends_on=first, delay_s=60)
    assert json.loads(r.hget(keys.job(after.id), "deps")) == [first.id] and after.state == "delayed"
    before = _keys_of(r, prefix)
    with pytest.raises(makespan.ValidationError, match="endpoint"):
        client.submit_job("no-such-endpoint", service_s=5)
    with pytest.raises(makespan.ValidationError):
        client.submit_job("embed", service_s=-1)
    assert _keys_of(r, prefix) == before


def test_a_job_handle_or_a_url_of_the_wrong_type_is_a_validation_error(redis_url):
    """``client.job(None)`` raised AttributeError at its first call and ``connect(13)`` a
    TypeError (a CLI review, 2026-12-07)."""
    with pytest.raises(makespan.ValidationError, match="must be a Redis URL string"):
        makespan.connect(13)
    client = makespan.connect(redis_url)
    try:
        for bad in (None, 123, "", "  "):
            with pytest.raises(makespan.ValidationError, match="must be a job id"):
                client.job(bad)
    finally:
        client.close()


def test_a_repeated_key_with_other_arguments_is_a_warning_in_python(client, caplog):
    """A re-run notebook cell with edited arguments and the same idempotency key silently got
    the old job: the unused options are now a warning on makespan.producer (was INFO)."""
    import logging

    client.submit("tests.two", 1, idempotency_key="cell-1")
    with caplog.at_level(logging.WARNING, logger="makespan.producer"):
        again = client.submit("tests.two", 2, idempotency_key="cell-1")
    assert not again.created and again.ignored == ("args",)
    assert any("idempotency key 'cell-1' already names job" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records), caplog.records


def test_an_unknown_job_names_where_it_was_looked_for(client, redis_url, prefix):
    """After a kernel restart without its %env cell (another prefix) or past the retention,
    `result()` said only "no job 'X'" (a notebook user, 2026-12-07)."""
    with pytest.raises(makespan.NotFoundError) as e:
        client.job("0123abcd").result(timeout_s=1)
    assert f"under key prefix {prefix!r} at {redis_url}" in str(e.value), e.value
    # both retention limits (a large-queue check: the count limit deleted it and was not named)
    assert "MAKESPAN_RETENTION_AGE_S (default 3600 s) and at most the MAKESPAN_RETENTION_JOBS latest" in str(e.value)
    # not this process's values: the planner's may differ (a verifier: it said 10,000 under a limit of 20)
    assert "as set where the planner runs" in str(e.value) and "; here " not in str(e.value), e.value


def test_result_timeout_is_a_timeout_error():
    assert issubclass(makespan.ResultTimeout, TimeoutError)  # `except TimeoutError` catches it


def test_a_cli_submit_in_this_process_leaves_the_python_warning_on(client, redis_url, prefix, caplog):
    """`makespan submit` run in-process (CliRunner, a program calling the CLI) left a filter on
    makespan.producer that dropped every later repeated-key warning of the Python API (and made
    the test above fail after tests/faults/test_redis_answers_error.py in the same worker)."""
    import logging

    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    CliRunner().invoke(cli_app, ["submit", "tests.two", "--args", "[1]", "--idempotency-key", "cli-1"],
                       env={"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix})
    with caplog.at_level(logging.WARNING, logger="makespan.producer"):
        again = client.submit("tests.two", 2, idempotency_key="cli-1")
    assert not again.created and again.ignored == ("args",)
    assert any("idempotency key 'cli-1' already names job" in r.getMessage() for r in caplog.records), caplog.records


def test_a_function_whose_endpoint_the_planner_dropped_is_refused_naming_the_function(client, r, keys):
    """After `chat` left the planner's fleet, a submit of a function whose decorator names
    `chat` said `job.endpoint: unknown endpoint` (a fleet-change operator): the user gave no
    endpoint. The refusal names the function and what to do; nothing is written."""
    publish(r, keys, [WorkloadDef("tests.gone_ep", _two, "gone")], ttl_s=600, holder="test")
    before = r.get(keys.seq)
    with pytest.raises(makespan.ValidationError, match=r"the endpoint of workload 'tests.gone_ep' \(its decorator's"
                                                       r".*not in the planner's fleet.*pass endpoint="):
        client.submit("tests.gone_ep", 1)
    with pytest.raises(makespan.ValidationError, match=r"job\.endpoint: unknown endpoint"):
        client.submit("tests.gone_ep", 1, endpoint="nope")  # one the user gave: said as before
    assert r.get(keys.seq) == before
