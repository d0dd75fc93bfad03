"""Fixtures for the observability tests: a known workload as recorded events."""

from __future__ import annotations

import pytest

from .events_fixture import G, T0, known_events


@pytest.fixture
def events() -> list[dict]:
    return known_events()


@pytest.fixture
def gpus() -> list[str]:
    return list(G)


@pytest.fixture
def t0() -> float:
    return T0
