"""Validation of fleet files and jobs: every error names the field and the value."""

import math

import pytest

from makespan.errors import ValidationError
from makespan.models import Priority, load_fleet, parse_fleet, parse_job

FLEET = "examples/render-pipeline.toml"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet(FLEET)


def test_example_fleet_has_set_point_and_transitions(fleet):
    assert fleet.gpu_count() == 8
    assert set(fleet.set_point_by_gpu().values()) == {"coder", "embed"}
    assert len(fleet.endpoints) >= 5  # coding, embedding, renderer + at least two more


@pytest.mark.parametrize("job,field,fragment", [
    ({"endpoint": "nope", "service_s": 1}, "job.endpoint", "unknown endpoint"),
    ({"endpoint": "coder", "service_s": 1, "priority": "URGENT"}, "job.priority", "unknown priority"),
    ({"endpoint": "coder", "service_s": 0}, "job.service_s", "positive"),
    ({"endpoint": "coder", "service_s": -3}, "job.service_s", "positive"),
    ({"endpoint": "coder", "service_s": math.inf}, "job.service_s", "finite"),
    ({"endpoint": "coder", "service_s": math.nan}, "job.service_s", "finite"),
    ({"endpoint": "coder", "service_s": 1, "colour": "red"}, "job.colour", "unknown key"),
    ({"endpoint": "coder", "service_s": 1, "payload": {"x": "a" * 70_000}}, "job.payload", "larger than"),
    ({"endpoint": "coder", "service_s": 1, "deadline_s": 0}, "job.deadline_s", "positive"),
])
def test_invalid_jobs_name_field_and_value(fleet, job, field, fragment):
    with pytest.raises(ValidationError) as e:
        parse_job(job, fleet)
    assert e.value.field == field
    assert fragment in str(e.value)
    assert "got" in str(e.value)


def _fleet(**endpoint):
    ep = {"model": "m", "tensor_parallel": 1, "memory_mib_per_gpu": 1000, "cold_start_s": 10, **endpoint}
    return {"hosts": [{"name": "h", "gpu_count": 8, "memory_mib": 46068}], "endpoints": {"e": ep}}


@pytest.mark.parametrize("endpoint,field,fragment", [
    ({"tensor_parallel": 16}, "endpoints.e.tensor_parallel", "larger than the largest host"),
    ({"memory_mib_per_gpu": 50_000}, "endpoints.e.memory_mib_per_gpu", "above the largest GPU"),
    ({"cold_start_s": 0}, "fleet.endpoints.e.cold_start_s", "positive"),
    ({"cold_start_s": float("inf")}, "fleet.endpoints.e.cold_start_s", "finite"),
    ({"evict_s": -1}, "fleet.endpoints.e.evict_s", "non-negative"),
    ({"slots": 0}, "fleet.endpoints.e.slots", "greater than or equal to 1"),
    # a boolean or a quoted number is not read as a number (a new user's `memory_mib_per_gpu = true`
    # was 1 MiB, `cold_start_s = "5"` 5 s)
    ({"memory_mib_per_gpu": True}, "fleet.endpoints.e.memory_mib_per_gpu", "must be a whole number, not a boolean"),
    ({"tensor_parallel": True}, "fleet.endpoints.e.tensor_parallel", "must be a whole number, not a boolean"),
    ({"slots": "3"}, "fleet.endpoints.e.slots", "must be a whole number, not text"),
    ({"cold_start_s": "5"}, "fleet.endpoints.e.cold_start_s", "must be a number, not text"),
    ({"evict_s": False}, "fleet.endpoints.e.evict_s", "must be a number, not a boolean"),
    ({"wake_s": "2"}, "fleet.endpoints.e.wake_s", "must be a number, not text"),
    ({"sleep_level": 1.5}, "fleet.endpoints.e.sleep_level", "valid integer"),
    ({"launch": {"sleep_mode": "yes"}}, "fleet.endpoints.e.launch.sleep_mode", "valid boolean"),
    ({"flavour": 1}, "fleet.endpoints.e.flavour", "unknown key"),
    ({"set_point": [{"host": "x", "gpus": [0]}]}, "endpoints.e.set_point.0.host", "unknown host"),
])
def test_invalid_fleets_name_field_and_value(endpoint, field, fragment):
    with pytest.raises(ValidationError) as e:
        parse_fleet(_fleet(**endpoint))
    assert e.value.field == field, str(e.value)
    assert fragment in str(e.value)


def test_a_fleet_with_several_bad_fields_names_every_one():
    """A user fixes them in one go, not one rerun per field; a host dropped for its bad
    field does not add a 'hosts: at least 1 item' of its own."""
    with pytest.raises(ValidationError) as e:
        parse_fleet(_fleet(memory_mib_per_gpu=-5, cold_start_s=True, evict_s="1"))
    message = str(e.value)
    assert e.value.field == "fleet.endpoints.e.memory_mib_per_gpu", message
    assert len(e.value.also) == 2 and "fleet.endpoints.e.cold_start_s: must be a number, not a boolean" in message
    assert "fleet.endpoints.e.evict_s: must be a number, not text" in message
    data = _fleet()
    data["hosts"] = [{"name": "h", "gpu_count": "two", "memory_mib": 100}]
    with pytest.raises(ValidationError) as e:
        parse_fleet(data)
    assert e.value.field == "fleet.hosts.0.gpu_count" and e.value.also == (), str(e.value)


def test_fleet_rejects_duplicate_gpu_uuid():
    data = {"hosts": [{"name": "a", "gpus": [{"uuid": "GPU-1", "memory_mib": 10, "index": 0}]},
                      {"name": "b", "gpus": [{"uuid": "GPU-1", "memory_mib": 10, "index": 0}]}],
            "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 5, "cold_start_s": 1}}}
    with pytest.raises(ValidationError, match="appears twice"):
        parse_fleet(data)


def test_two_simulated_hosts_of_one_name_are_named_as_such():
    """Both get GPU UUIDs GPU-h-0…: the error names the host name, not a UUID."""
    host = {"name": "h", "gpu_count": 2, "memory_mib": 100}
    data = {"hosts": [host, host], "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 5, "cold_start_s": 1}}}
    with pytest.raises(ValidationError) as e:
        parse_fleet(data)
    assert e.value.field == "hosts.name" and "host names must be unique" in str(e.value) and "'h'" in str(e.value)


def test_a_quoted_or_fractional_gpu_memory_is_rejected_and_a_whole_float_is_a_count():
    def fleet(host):
        return {"hosts": [host], "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 5, "cold_start_s": 1}}}

    for host, fragment in (({"name": "h", "gpu_count": 2, "memory_mib": "100"}, "not text"),
                           ({"name": "h", "gpus": [{"uuid": "GPU-1", "memory_mib": 10, "index": True}]}, "not a boolean"),
                           ({"name": "h", "gpu_count": 2, "memory_mib": 100.5}, "fractional part")):
        with pytest.raises(ValidationError, match=fragment) as err:
            parse_fleet(fleet(host))
        # the field the user wrote, not the GPU entries gpu_count expands it into
        assert err.value.field in ("fleet.hosts.0.memory_mib", "fleet.hosts.0.gpus.0.index"), err.value.field
    assert parse_fleet(fleet({"name": "h", "gpu_count": 2, "memory_mib": 81920.0})).hosts[0].gpus[0].memory_mib == 81920


def test_fleet_file_errors(tmp_path, monkeypatch):
    with pytest.raises(ValidationError, match="no such file") as missing:
        load_fleet(tmp_path / "missing.toml")
    assert "working directory" not in str(missing.value)
    monkeypatch.chdir(tmp_path)  # a relative path names where it was looked for (a supervisor's WorkingDirectory)
    with pytest.raises(ValidationError, match=f"no such file \\(relative to the working directory {tmp_path}\\)"):
        load_fleet("examples/missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("hosts = [")
    with pytest.raises(ValidationError, match="not valid TOML"):
        load_fleet(bad)


def test_priorities_weights_and_preemption_rules():
    assert [p.weight for p in Priority] == [8, 4, 2, 1]
    assert Priority.CRITICAL.may_preempt(Priority.HIGH)
    assert Priority.HIGH.may_preempt(Priority.LOW)
    assert not Priority.HIGH.may_preempt(Priority.CRITICAL)
    assert not Priority.NORMAL.may_preempt(Priority.LOW)
    assert Priority.parse("low") is Priority.LOW
    with pytest.raises(ValidationError):
        Priority.parse(7)


def test_a_priority_index_as_text_is_a_level():
    """``--priority 0`` on the command line (the docs' "or 0–3"), and ``jobs --priority 0``."""
    assert Priority.parse("0") is Priority.CRITICAL and Priority.parse("3") is Priority.LOW
    for bad in ("4", "-1", "1.0", " 1", ""):
        with pytest.raises(ValidationError):
            Priority.parse(bad)


def test_gpu_count_beside_a_gpus_list_of_another_length_and_an_empty_fleet_name_are_refused():
    """A host with gpu_count = 2 and one GPU listed passed as one GPU, gpu_count ignored; a
    fleet named "" passed (a CLI review, 2026-12-07)."""
    endpoints = {"e": {"model": "m", "memory_mib_per_gpu": 5, "cold_start_s": 1}}
    host = {"name": "a", "gpu_count": 2, "gpus": [{"uuid": "GPU-1", "memory_mib": 10, "index": 0}]}
    with pytest.raises(ValidationError, match="gpu_count = 2 but gpus lists 1"):
        parse_fleet({"hosts": [host], "endpoints": endpoints})
    host["gpu_count"] = 1  # agreeing: accepted, and real GPUs (checked against NVML), not simulated
    parsed = parse_fleet({"hosts": [host], "endpoints": endpoints}).hosts[0]
    assert len(parsed.gpus) == 1 and not parsed.simulated
    simulated = parse_fleet({"hosts": [{"name": "s", "gpu_count": 2, "memory_mib": 10}], "endpoints": endpoints})
    assert simulated.hosts[0].simulated and parse_fleet(simulated.model_dump()).hosts[0].simulated  # published too
    with pytest.raises(ValidationError) as e:
        parse_fleet({"name": "", "hosts": [host], "endpoints": endpoints})
    assert e.value.field == "fleet.name", e.value
