"""A workload function's job whose result expired (``MAKESPAN_RESULT_TTL_S``) while its
summary lived on (a retention age above the result TTL) came back as ``None`` and
``makespan result`` printed ``null`` with exit 0: read as the function's return value
(workload-author new user). It is ``ResultExpired`` (a NotFoundError; exit 2) now; a plain
job's completion is still None."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from makespan.cli import app as cli_app
from makespan.client import Client
from makespan.errors import NotFoundError, ResultExpired


def _completed(r, keys, job_id: str, fn: str | None) -> None:
    r.hset(keys.job(job_id), mapping={"id": job_id, "state": "completed", "priority": "NORMAL", "endpoint": "sim",
                                       "finished_at": "1.0", **({"fn": fn} if fn else {})})


def test_an_expired_result_is_an_error_not_none(r, keys, settings, monkeypatch):
    _completed(r, keys, "f1", "add")
    _completed(r, keys, "p1", None)
    client = Client(r, settings)
    with pytest.raises(ResultExpired, match="completed at 1970-01-01T00:00:01Z .* s ago., but its result is gone.*"
                                            "MAKESPAN_RESULT_TTL_S.*the workers' may differ"):
        client.job("f1").result(timeout_s=0)  # when it ended: the reader's TTL need not be the workers
    assert isinstance(ResultExpired("x"), NotFoundError)
    assert client.job("p1").result(timeout_s=0) is None  # a plain job: no function, no value
    monkeypatch.setenv("MAKESPAN_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", settings.key_prefix)
    res = CliRunner().invoke(cli_app, ["result", "f1"])
    assert res.exit_code == 2 and "result is gone" in res.output, res.output


def test_an_error_text_over_the_cap_says_it_was_cut():
    """A message over 64 KiB was cut with no sign of it (workload-author new user)."""
    import json

    from makespan.results import ERROR_TEXT_MAX_CHARS, encode_error

    err = json.loads(encode_error("ValueError", "m" * (ERROR_TEXT_MAX_CHARS + 10), "t" * (ERROR_TEXT_MAX_CHARS + 5),
                                  1))["error"]
    assert err["message"] == "m" * ERROR_TEXT_MAX_CHARS + " [… 10 characters cut]"
    assert err["traceback"] == "[… 5 characters cut] " + "t" * ERROR_TEXT_MAX_CHARS
    short = json.loads(encode_error("ValueError", "short", "tb", 1))["error"]
    assert (short["message"], short["traceback"]) == ("short", "tb")


def test_a_lone_surrogate_in_an_argument_names_where_it_is():
    """``submit(..., "\\ud800")`` said ``(got '<list>')`` and no path, unlike the other JSON
    errors (Celery user's check)."""
    from makespan.errors import ValidationError
    from makespan.models import json_size

    with pytest.raises(ValidationError, match=r"job\.args\[1\]\['k'\]: a string with a lone surrogate"):
        json_size(["ok", {"k": "\ud800"}], "job.args")


def test_a_failed_functions_expired_error_says_it_is_gone(r, keys, settings):
    """After the result TTL a function's error came back as JobFailed with the record's
    reason and nothing saying the stored error (type, traceback) had expired (verifier)."""
    from makespan.errors import JobFailed

    r.hset(keys.job("f2"), mapping={"id": "f2", "state": "failed", "priority": "NORMAL", "endpoint": "sim",
                                     "finished_at": "1.0", "fn": "boom", "reason": "execute: RuntimeError: kaboom"})
    with pytest.raises(JobFailed, match="RuntimeError: kaboom .the function's stored error, with its type and "
                                        "traceback, is gone"):
        Client(r, settings).job("f2").result(timeout_s=0)


def test_a_failed_reference_is_not_said_as_an_expired_stored_error(r, keys, settings):
    """A job whose argument's result was gone failed before its function ran; its
    JobFailed still said "the function's stored error ... is gone" (workload-author
    helper): there never was one."""
    from makespan.errors import JobFailed

    r.hset(keys.job("f3"), mapping={"id": "f3", "state": "failed", "priority": "NORMAL", "endpoint": "sim",
                                     "finished_at": "1.0", "fn": "boom",
                                     "reason": "execute: argument refers to job a1, which has no result (not stored "
                                               "or expired)"})
    with pytest.raises(JobFailed) as failed:
        Client(r, settings).job("f3").result(timeout_s=0)
    assert "argument refers to job a1" in str(failed.value) and "stored error" not in str(failed.value)


def test_an_error_without_a_message_reads_no_message():
    from makespan.errors import WorkloadError

    assert str(WorkloadError("j1", "ValueError", "")).endswith("ValueError (no message)")
    assert str(WorkloadError("j1", "ValueError", "bad")).endswith("ValueError: bad")
