"""Issue 18, failure 10: a payload that JSON cannot carry is a ValidationError at submit.

A lone surrogate, or nesting deeper than pydantic's serializer allows (about 256
levels), passed ``parse_job`` and then raised ``PydanticSerializationError`` from the
submit's own encoding. Each must now be refused in validation and leave nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from makespan.errors import ValidationError
from makespan.models import load_fleet
from makespan.producer import Producer


def _nested(depth: int) -> dict:
    doc: dict = {"leaf": 1}
    for _ in range(depth):
        doc = {"n": doc}
    return doc


@pytest.mark.parametrize("payload", [{"text": "\ud800"}, {"items": ["ok", "\udfff tail"]}, _nested(300)],
                         ids=["lone-surrogate", "surrogate-in-list", "nested-300"])
def test_unencodable_payload_is_a_counted_validation_error(r, keys, settings, payload):
    prod = Producer(r, keys, load_fleet(Path("examples/render-pipeline.toml")), settings)
    with pytest.raises(ValidationError) as err:
        prod.submit({"endpoint": "chat", "service_s": 1, "payload": payload})
    assert err.value.field.startswith("job")
    assert r.get(keys.seq) is None and not list(r.scan_iter(keys.job("*")))
