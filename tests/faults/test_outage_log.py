"""A loop that retries Redis every few hundred ms during an outage (a planner standing by
with a refused password, the tick loop, the critical lane, the observer) logs the outage's
first failure, then at most one line per 30 s with a count, and one line when Redis
answers again (``makespan.redis_conn.OutageLog``): before, the planner wrote a warning
every 200 ms for as long as the outage lasted."""

from __future__ import annotations

import logging
import threading

import redis

from makespan.models import load_fleet
from makespan.redis_conn import OutageLog, connect
from makespan.settings import Settings
from makespan.workers import planner_worker
from makespan.workers.planner_worker import PlannerWorker
from tests.conftest import FLEET_TOML
from tests.live import wait_for


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_one_line_per_interval_and_one_when_it_ends(caplog):
    clock = _Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "loop", every_s=30.0, clock=clock)
    err = redis.ConnectionError("Connection refused")
    with caplog.at_level(logging.INFO, logger="test.outage"):
        for _ in range(150):  # 30 s of failures every 0.2 s: the first line only
            outage.failed(err)
            clock.now_s += 0.2
        assert [r.getMessage() for r in caplog.records] == ["loop: Redis unavailable: Connection refused"]
        outage.failed(err)  # 30 s after the first line: a second one, with the count
        assert caplog.records[-1].getMessage() == ("loop: Redis still unavailable after 30 s (151 failures, "
                                                  "149 not logged): Connection refused")
        clock.now_s += 1.0
        outage.ok()
        assert caplog.records[-1].levelno == logging.INFO
        assert caplog.records[-1].getMessage() == "loop: Redis answers again after 31.0 s (151 failures)"
        outage.ok()  # no outage: nothing logged
        outage.failed(err)  # a new outage opens with a line of its own
        assert len(caplog.records) == 4
        assert caplog.records[-1].getMessage() == "loop: Redis unavailable: Connection refused"


def test_a_standby_planner_logs_an_outage_once(monkeypatch, caplog, refused_port):
    """A real planner standing by against a port where no Redis listens."""
    made: list[OutageLog] = []

    class Counted(OutageLog):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(planner_worker, "OutageLog", Counted)
    url = f"redis://127.0.0.1:{refused_port}/0"
    # a socket timeout the leader lock fits (makespan.settings.planner_lock_warning): its one line is the outage's
    w = PlannerWorker(connect(url), Settings(redis_url=url, key_prefix="mst-outage-log", redis_socket_timeout_s=1.0),
                      load_fleet(FLEET_TOML))
    thread = threading.Thread(target=w.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="makespan.planner"):
        thread.start()
        wait_for(lambda: made and made[0].failures >= 5, 30, "five failed attempts to take the planner lock")
        w.stop()
        thread.join(10)
    assert not thread.is_alive()
    lines = [r.getMessage() for r in caplog.records if r.name == "makespan.planner"]
    assert len(lines) == 1, lines
    assert "standing by: Redis unavailable" in lines[0]
