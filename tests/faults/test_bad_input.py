"""Bad input: malformed jobs, fleets and CLI arguments get a ValidationError naming the
field and change no state; 10,000 generated submissions leave no partial record.

Property-based (hypothesis) over the job and fleet schemas: each example breaks one
field of a valid document in a way drawn from that field's failure modes.
"""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.errors import ValidationError
from makespan.models import load_fleet, parse_fleet, parse_job
from makespan.producer import Producer
from tests.conftest import FLEET_TOML

FLEET = load_fleet(FLEET_TOML)
PROFILE = hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

# -- jobs ---------------------------------------------------------------------------------
VALID_JOB = {"endpoint": "chat", "service_s": 30.0, "priority": "HIGH", "payload": {"x": 1}}
def _numeric(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


# pydantic's lax mode reads "30" as 30.0 (documented); other text is not a number
not_a_number = st.one_of(st.text(max_size=5).filter(lambda t: not _numeric(t)), st.none(), st.lists(st.integers(), max_size=2), st.booleans())
bad_seconds = st.one_of(not_a_number, st.sampled_from([0, -1, -0.5, math.nan, math.inf, -math.inf]))
BAD_JOB_FIELDS = {
    "endpoint": st.one_of(st.text(max_size=20).filter(lambda s: s.strip() not in FLEET.endpoints),
                          st.integers(), st.none()),
    "service_s": bad_seconds,
    "priority": st.one_of(st.text(max_size=8).filter(lambda s: s.strip().upper() not in
                                                     ("CRITICAL", "HIGH", "NORMAL", "LOW")),
                          st.integers().filter(lambda i: not 0 <= i <= 3), st.floats(allow_nan=True)),
    "payload": st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3),
                         st.just({"blob": "x" * (64 * 1024 + 1)}), st.just({"f": math.nan})),
    "idempotency_key": st.one_of(st.just(""), st.text(min_size=201, max_size=210), st.integers()),
    "deadline_s": bad_seconds.filter(lambda v: v is not None),
}


@st.composite
def bad_jobs(draw):
    job = dict(VALID_JOB)
    if draw(st.booleans()) and draw(st.booleans()):  # an unknown key
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in job and k not in BAD_JOB_FIELDS
                                                           and k not in ("workload_id", "step", "depends_on")))
        job[key] = draw(st.integers())
        return job, key
    field = draw(st.sampled_from(sorted(BAD_JOB_FIELDS)))
    job[field] = draw(BAD_JOB_FIELDS[field])
    return job, field


def _keys_of(r, prefix):
    return sorted(r.scan_iter(f"{prefix}:*", count=1000))


@PROFILE
@given(bad_jobs())
def test_malformed_job_names_its_field_and_writes_nothing(r, prefix, keys, settings, case):
    job, field = case
    prod = Producer(r, keys, FLEET, settings)
    before = _keys_of(r, prefix)
    with pytest.raises(ValidationError) as ei:
        prod.submit(job)
    assert ei.value.field == f"job.{field}", (job, str(ei.value))
    assert ei.value.reason and str(ei.value).startswith(f"job.{field}: ")
    assert _keys_of(r, prefix) == before


@pytest.mark.parametrize("key", ["k" * 200 + "\x85", " k", "k\t", "a\x00b"])
def test_idempotency_key_is_taken_verbatim_or_refused(r, prefix, keys, settings, key):
    # found by hypothesis: a 201-character key ending in U+0085 was stripped to 200 and
    # accepted; a key is an identity, so it is never rewritten
    before = _keys_of(r, prefix)
    with pytest.raises(ValidationError) as ei:
        Producer(r, keys, FLEET, settings).submit({**VALID_JOB, "idempotency_key": key})
    assert ei.value.field == "job.idempotency_key"
    assert _keys_of(r, prefix) == before


def test_job_that_is_not_a_mapping_is_refused():
    for bad in (None, [], "chat", 3):
        with pytest.raises(ValidationError) as ei:
            parse_job(bad, FLEET)
        assert ei.value.field == "job"


# -- fleets -------------------------------------------------------------------------------
def _fleet_doc() -> dict:
    return {"name": "f", "hosts": [{"name": "h1", "gpu_count": 2, "memory_mib": 40000}],
            "endpoints": {"chat": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 10,
                                   "set_point": [{"host": "h1", "gpus": [0]}]}}}


# (path into the document, bad value, field the error must name)
FLEET_BREAKS = [
    (("hosts", 0, "gpu_count"), st.sampled_from([0, -1, 65, "two"]), "fleet.hosts.0.gpu_count"),
    (("hosts", 0, "memory_mib"), st.sampled_from([0, -5, "big"]), "fleet.hosts.0"),
    (("hosts", 0, "name"), st.sampled_from(["", "bad name", "-x", "a" * 70, "h/1"]), "fleet.hosts.0.name"),
    (("endpoints", "chat", "tensor_parallel"), st.sampled_from([3, 4, 0, -1]), "chat.tensor_parallel"),
    (("endpoints", "chat", "memory_mib_per_gpu"), st.sampled_from([0, 40001, 10**7]), "chat.memory_mib_per_gpu"),
    (("endpoints", "chat", "cold_start_s"), st.sampled_from([0, -1, math.nan, math.inf, "slow"]),
     "chat.cold_start_s"),
    (("endpoints", "chat", "evict_s"), st.sampled_from([-1, math.nan, math.inf]), "chat.evict_s"),
    (("endpoints", "chat", "slots"), st.sampled_from([0, -3, 5000]), "chat.slots"),
    (("endpoints", "chat", "set_point", 0, "host"), st.sampled_from(["nope", "h2"]), "chat.set_point.0.host"),
    (("endpoints", "chat", "set_point", 0, "gpus"), st.sampled_from([[7], [0, 1], []]), "chat.set_point"),
    (("endpoints", "chat", "launch"), st.sampled_from([{"driver": "shell"}, {"cmd": "rm -rf /"},
                                                       {"gpu_memory_utilization": 2}]), "chat.launch"),
    (("endpoints", "chat", "surprise"), st.integers(), "chat.surprise"),
    (("hosts",), st.sampled_from([[], None]), "fleet.hosts"),
]


@PROFILE
@given(st.data())
def test_malformed_fleet_names_its_field(data):
    path, bad, want = data.draw(st.sampled_from(FLEET_BREAKS))
    doc = copy.deepcopy(_fleet_doc())
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = data.draw(bad)
    with pytest.raises(ValidationError) as ei:
        parse_fleet(doc)
    assert want in ei.value.field, (path, ei.value.field, str(ei.value))


def test_fleet_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("hosts = [")
    for p, reason in ((tmp_path / "missing.toml", "no such file"), (bad, "not valid TOML")):
        with pytest.raises(ValidationError) as ei:
            load_fleet(p)
        assert ei.value.field == "fleet file" and reason in ei.value.reason


# -- CLI arguments --------------------------------------------------------------------------
CLI_BREAKS = [
    (["--endpoint", "nope", "--service-s", "5"], "job.endpoint"),
    (["--endpoint", "chat", "--service-s", "-5"], "job.service_s"),
    (["--endpoint", "chat", "--service-s", "nan"], "job.service_s"),
    (["--endpoint", "chat", "--service-s", "5", "--priority", "URGENT"], "job.priority"),
    (["--endpoint", "chat", "--service-s", "5", "--payload", "[1, 2]"], "job.payload"),
    (["--endpoint", "chat", "--service-s", "5", "--payload", "{not json"], "--payload"),
]


@pytest.mark.parametrize("args,field", CLI_BREAKS)
def test_cli_submit_rejects_bad_arguments_without_writing(r, prefix, redis_url, args, field):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit", "--fleet", FLEET_TOML, *args], env=env)
    assert res.exit_code == 2, res.output
    assert field in res.output
    assert _keys_of(r, prefix) == []


def test_cli_submit_quiet_prints_the_id_alone(r, prefix, redis_url, keys):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit", "--fleet", FLEET_TOML, "--endpoint", "chat", "--service-s", "5",
                                       "--quiet"], env=env)
    assert res.exit_code == 0, res.output
    jid = res.stdout.strip()
    assert r.hget(keys.job(jid), "state") == "queued"
    # no GPU worker runs: the job waits, and stderr (not the id on stdout) says so
    assert "warning: no GPU worker runs on" in res.stderr and "endpoint 'chat'" in res.stderr, res.stderr
    from makespan.workers.host_liveness import announce

    assert "warning: no planner leads this fleet" in res.stderr and "reason no_planner" in res.stderr
    fleet = load_fleet(FLEET_TOML)
    for host in fleet.hosts:
        announce(r, keys, host.name, "a-worker", 30.0)
    r.set(keys.planner_leader, "a-planner")  # a leading planner holds the lock
    again = CliRunner().invoke(cli_app, ["submit", "--fleet", FLEET_TOML, "--endpoint", "chat", "--service-s", "5",
                                         "--quiet"], env=env)
    assert again.exit_code == 0 and again.stderr == "", again.stderr


def test_cli_submit_warns_when_a_dependency_has_already_ended_without_completing(r, prefix, redis_url, keys):
    """Depending on a job already cancelled is accepted (the planner's next tick cancels the
    dependant, docs/configuration.md) but said nothing (new-user check): stderr says so."""
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    base = ["submit", "--fleet", FLEET_TOML, "--endpoint", "chat", "--service-s", "5", "--quiet"]
    first = CliRunner().invoke(cli_app, base, env=env).stdout.strip()
    fine = CliRunner().invoke(cli_app, [*base, "--depends-on", first], env=env)
    assert fine.exit_code == 0 and "dependency" not in fine.stderr, fine.stderr
    assert CliRunner().invoke(cli_app, ["cancel", first], env=env).exit_code == 0
    res = CliRunner().invoke(cli_app, [*base, "--depends-on", first], env=env)
    assert res.exit_code == 0 and r.hget(keys.job(res.stdout.strip()), "state") == "queued"
    assert f"warning: dependency {first} has already been cancelled: this job will never run" in res.stderr, res.stderr


def test_cli_rejects_bad_settings_variable(r, prefix, redis_url):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix, "MAKESPAN_LEASE_TTL_S": "-3"}
    res = CliRunner().invoke(cli_app, ["planner", "--fleet", FLEET_TOML], env=env)
    assert res.exit_code == 2 and "MAKESPAN_LEASE_TTL_S" in res.output


# -- 10,000 submissions: all or nothing -----------------------------------------------------
def _random_job(rng: random.Random, i: int) -> dict:
    job = {"endpoint": rng.choice(sorted(FLEET.endpoints)), "service_s": rng.uniform(1, 100),
           "priority": rng.choice(["CRITICAL", "HIGH", "NORMAL", "LOW"]), "payload": {"i": i}}
    if rng.random() < 0.2:
        job["idempotency_key"] = f"k{rng.randrange(500)}"  # repeats: the existing job comes back
    roll = rng.random()
    if roll < 0.1:
        job["service_s"] = rng.choice([0, -1, math.nan, math.inf, "x"])
    elif roll < 0.2:
        job["endpoint"] = "nope"
    elif roll < 0.25:
        job["payload"] = {"blob": "x" * 70_000}
    elif roll < 0.3:
        job["extra"] = 1
    elif roll < 0.35:
        job["priority"] = "URGENT"
    return job


def test_10000_generated_submissions_leave_no_partial_record(r, prefix, keys, settings):
    rng = random.Random(20260)
    prod = Producer(r, keys, FLEET, settings)
    created: dict[str, str] = {}
    rejected = 0
    for i in range(10_000):
        try:
            h = prod.submit(_random_job(rng, i))
        except ValidationError:
            rejected += 1
            continue
        if h.created:
            created[h.id] = h.priority.name
    assert rejected > 1000 and len(created) > 5000
    job_keys = {k.rsplit(":", 1)[1] for k in r.scan_iter(keys.job("*"), count=5000)}
    assert job_keys == set(created)  # no record for a rejected job, none missing for an accepted one
    queued = {}
    for lvl in ("CRITICAL", "HIGH", "NORMAL", "LOW"):
        for jid in r.zrange(keys.queue(lvl), 0, -1):
            queued[jid] = lvl
    assert queued == created  # every accepted job is queued once, at its own level
    p = r.pipeline(transaction=False)
    for jid in created:
        p.hmget(keys.job(jid), "id", "state", "endpoint", "priority", "seq", "spec", "service_s")
    for vals in p.execute():
        assert None not in vals and vals[1] == "queued"
        json.loads(vals[5])
    submitted = sum(1 for _id, f in r.xrange(keys.events) if json.loads(f["e"])["kind"] == "submitted")
    assert submitted == len(created)
    assert int(r.get(keys.seq)) == len(created)


def test_an_argument_json_cannot_carry_is_named_by_its_place():
    """A new user passed a set as an argument and read ``(got '<list>')``: the message now
    names the argument's place and type instead of the container's."""
    from makespan.models import json_size

    with pytest.raises(ValidationError) as err:
        json_size(["hi", {1, 2}], "job.args")
    assert "(job.args[1]: of type set)" in str(err.value) and "<list>" not in str(err.value)
    with pytest.raises(ValidationError) as err:
        json_size({"when": {"at": object()}}, "job.kwargs")
    assert "(job.kwargs['when']['at']: of type object)" in str(err.value)
    with pytest.raises(ValidationError) as err:  # the first offender, not a later one (a reviewer's case)
        json_size([math.nan, {1, 2}], "job.args")
    assert "(job.args[0]: the float nan)" in str(err.value)
    with pytest.raises(ValidationError) as err:
        json_size({"a": {(1, 2): 1}, "b": {3}}, "job.kwargs")
    assert "(job.kwargs['a']: a mapping with a key of type tuple)" in str(err.value)


@pytest.mark.parametrize("option,text", [("--args", '["hi"'), ("--kwargs", "{not json")])
def test_cli_names_which_of_args_and_kwargs_is_not_json(r, prefix, redis_url, option, text):
    env = {"MAKESPAN_REDIS_URL": redis_url, "MAKESPAN_KEY_PREFIX": prefix}
    res = CliRunner().invoke(cli_app, ["submit", "some.function", option, text], env=env)
    assert res.exit_code == 2, res.output
    other = {"--args": "--kwargs", "--kwargs": "--args"}[option]
    assert f"{option}: not JSON" in res.output and other not in res.output, res.output
    assert _keys_of(r, prefix) == []


def test_an_argument_mismatch_shows_the_signature_as_python_writes_it():
    """``def f(ctx, a, *, b)`` was shown as ``f(a, b)`` beside "too many positional
    arguments", which contradicted it."""
    from makespan.registry import check_call

    definition = {"name": "f", "parameters": [
        {"name": "a", "kind": "POSITIONAL_ONLY", "required": True},
        {"name": "b", "kind": "POSITIONAL_OR_KEYWORD", "required": False},
        {"name": "c", "kind": "KEYWORD_ONLY", "required": True}]}
    with pytest.raises(ValidationError) as err:
        check_call(definition, [1, 2, 3], {})
    assert "do not match f(a, /, b=…, *, c) (makespan passes its ctx first" in str(err.value)
    assert "too many positional arguments" in str(err.value) and "this submit gave 3 positional arguments" in str(err.value)
    check_call(definition, [1], {"c": 3})  # binds: nothing raised
