"""Settings from MAKESPAN_* variables: numbers that may be zero, a choice among names."""

import pytest

from makespan.errors import ValidationError
from makespan.settings import Settings


@pytest.mark.parametrize("raw,value", [("0", 0.0), ("0.00", 0.0), ("2.5", 2.5)])
def test_retry_backoff_accepts_any_spelling_of_zero(monkeypatch, raw, value):
    monkeypatch.setenv("MAKESPAN_RETRY_BACKOFF_S", raw)
    assert Settings.from_env().retry_backoff_s == value


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "soon"])
def test_retry_backoff_refuses_negative_or_not_finite(monkeypatch, raw):
    monkeypatch.setenv("MAKESPAN_RETRY_BACKOFF_S", raw)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_RETRY_BACKOFF_S"


@pytest.mark.parametrize("raw,mode", [("", "plan"), ("plan", "plan"), ("rule", "rule")])
def test_preemption_mode_from_env(monkeypatch, raw, mode):
    monkeypatch.setenv("MAKESPAN_PREEMPTION", raw)
    assert Settings.from_env().preemption == mode


def test_preemption_mode_refuses_unknown(monkeypatch):
    monkeypatch.setenv("MAKESPAN_PREEMPTION", "sometimes")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_PREEMPTION"


def test_improver_executor_is_process_by_default_and_a_known_name(monkeypatch):
    monkeypatch.delenv("MAKESPAN_IMPROVER_EXECUTOR", raising=False)
    assert Settings.from_env().improver_executor == "process"
    monkeypatch.setenv("MAKESPAN_IMPROVER_EXECUTOR", "thread")
    assert Settings.from_env().improver_executor == "thread"
    monkeypatch.setenv("MAKESPAN_IMPROVER_EXECUTOR", "fork")
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_IMPROVER_EXECUTOR"


@pytest.mark.parametrize("raw,ok", [("0", True), ("19", True), ("", True), ("20", False), ("-1", False), ("5.5", False)])
def test_improver_nice_is_a_whole_number_from_0_to_19(monkeypatch, raw, ok):
    monkeypatch.setenv("MAKESPAN_IMPROVER_NICE", raw)
    if ok:
        assert Settings.from_env().improver_nice == (int(raw) if raw else 5)
    else:
        with pytest.raises(ValidationError) as ei:
            Settings.from_env()
        assert ei.value.field == "MAKESPAN_IMPROVER_NICE"


@pytest.mark.parametrize("raw, value", [(None, 0.0), ("", 0.0), ("0", 0.0), ("2.5", 2.5)])
def test_set_point_weight_from_env(monkeypatch, raw, value):
    if raw is None:
        monkeypatch.delenv("MAKESPAN_SET_POINT_WEIGHT", raising=False)
    else:
        monkeypatch.setenv("MAKESPAN_SET_POINT_WEIGHT", raw)
    s = Settings.from_env()
    assert s.set_point_weight == value
    assert Settings.from_env(**{}).to_env()["MAKESPAN_SET_POINT_WEIGHT"] == repr(value)


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "x"])
def test_set_point_weight_refuses_negative_or_not_finite(monkeypatch, raw):
    monkeypatch.setenv("MAKESPAN_SET_POINT_WEIGHT", raw)
    with pytest.raises(ValidationError) as ei:
        Settings.from_env()
    assert ei.value.field == "MAKESPAN_SET_POINT_WEIGHT"
