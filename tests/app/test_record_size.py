"""A queued job's record holds nothing twice (issue 21 point 4, bench/queued_bytes.py): the
``spec`` JSON leaves out what the record holds as its own fields and the defaults, so a
plain job's record is a compact listpack hash in Redis, not a hashtable."""

from __future__ import annotations

import json

from makespan.models import load_fleet
from makespan.producer import Producer
from tests.conftest import FLEET_TOML


def test_a_plain_queued_job_is_a_small_listpack_record(r, keys, settings):
    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "embed", "service_s": 5, "priority": "HIGH", "deadline_s": 30}).id
    record = r.hgetall(keys.job(job))
    assert json.loads(record["spec"]) == {}
    assert "tp" not in record  # the fleet's endpoint says it
    assert (record["endpoint"], record["priority"], record["service_s"], record["deadline_s"]) == \
        ("embed", "HIGH", "5.0", "30.0")
    assert r.object("encoding", keys.job(job)) == "listpack"
    assert r.memory_usage(keys.job(job), samples=0) < 400  # a hashtable record was > 800 B


def test_the_spec_keeps_what_the_record_does_not_hold(r, keys, settings):
    from makespan.producer import SPEC_IN_RECORD

    prod = Producer(r, keys, load_fleet(FLEET_TOML), settings)
    job = prod.submit({"endpoint": "embed", "service_s": 5, "payload": {"prompt": "p"},
                       "idempotency_key": "k-1"}).id
    spec = json.loads(r.hget(keys.job(job), "spec"))
    assert spec == {"payload": {"prompt": "p"}, "idempotency_key": "k-1"}
    assert not SPEC_IN_RECORD & set(spec)
