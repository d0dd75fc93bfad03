"""The default policy in the live planner: greedy per tick, CP-SAT improver in a child
process (workers/improver.py; or a thread); the improved plan is adopted only when it
scores better on the tick that uses it. The child is replaced when it dies and ended
when the planner stops; it ends by itself when the planner process is killed."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from makespan.producer import Producer
from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate, score
from makespan.planner.model import PlanJob
from makespan.planner.synthetic import instance
from tests.faults.test_priority_cases import ONE_GPU
from makespan.errors import ValidationError
from makespan.workers.improver import BackgroundImprover, adapt
from makespan.workers.planner_worker import PlannerWorker

SEED = 25  # a 6-job, 2-GPU batch where the portfolio is 2,841.3 and the optimum 1,927.0


def _case():
    batch, state = instance(6, 2, models=3, seed=SEED, gang=False)
    return batch, state, plan(batch, state, "portfolio"), plan(batch, state, "default", time_limit_s=5)


def test_case_has_an_improvement_to_find():
    _b, _s, floor, best = _case()
    assert score(best) < 0.9 * score(floor) and best.stats["proven_optimal"] == 1.0


def test_adapt_keeps_order_and_groups_and_never_loses_on_the_same_state():
    batch, state, _floor, best = _case()
    out = adapt(best, batch, state)
    assert out is not None and score(out) <= score(best) + 1e-6
    assert {a.job_id: a.gpus for a in out.assignments} == {a.job_id: a.gpus for a in best.assignments}
    evaluate(out, batch, state)  # feasible under the evaluator (raises otherwise)


def test_adapt_drops_started_jobs_and_places_new_ones():
    batch, state, _floor, best = _case()
    first = min(best.assignments, key=lambda a: a.start_s).job_id
    new = PlanJob("late", batch[0].endpoint, 8.0, 0.0, 30.0, 0, seq=99)
    rest = [j for j in batch if j.id != first] + [new]
    out = adapt(best, rest, state)
    assert out is not None
    assert sorted(a.job_id for a in out.assignments) == sorted(j.id for j in rest)
    assert adapt(best, [new], state) is None  # nothing of the improved plan is left


@pytest.mark.parametrize("executor", ["process", "thread"])
def test_background_improver_adopts_only_a_better_plan(executor):
    batch, state, floor, best = _case()
    imp = BackgroundImprover("default", time_limit_s=5, executor=executor)
    assert imp.best(floor, batch, state) is floor  # nothing solved yet
    assert imp.offer(batch, state)
    assert imp.wait_idle(30)
    assert not imp.offer(batch, state)  # the same batch is not solved twice
    got = imp.best(floor, batch, state)
    assert score(got) == score(best) and imp.stats["adopted"] == 1
    assert got.stats["greedy_score"] == score(floor)
    assert imp.best(best, batch, state) is best  # not strictly better than the floor: floor kept
    short = BackgroundImprover("default", time_limit_s=5)
    assert not short.worth_solving(49.0) and short.worth_solving(50.0)  # 10 time limits
    worse = BackgroundImprover("fifo", time_limit_s=1, executor=executor)
    worse.offer(batch, state)
    assert worse.wait_idle(30)
    assert worse.best(floor, batch, state) is floor
    assert (imp.child_pid() is None) == (executor == "thread")
    imp.close(), worse.close(), short.close()
    assert not imp.offer(batch[:3], state)  # closed: no further solves
    with pytest.raises(ValidationError):
        BackgroundImprover("default", time_limit_s=1, executor="fork")
    with pytest.raises(ValidationError):
        BackgroundImprover("default", time_limit_s=1, child_nice=20)


def test_live_planner_runs_the_default_policy_with_the_improver(r, keys, settings):
    assert settings.policy == "default"
    # plans of ~0.46 wall s: ≥ 10 limits. The lease outlives any wait for the improver's
    # child (its start took more than the fixtures' 3 s TTL on a loaded host, and the
    # expired lease's job was dispatched again on the second tick)
    settings = dataclasses.replace(settings, solve_time_limit_s=0.01, lease_ttl_s=600.0)
    sent = []
    w = PlannerWorker(r, settings, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    prod = Producer(r, keys, ONE_GPU, settings)
    for i in range(4):
        prod.submit({"endpoint": "e", "service_s": 10 + i})
    w.tick()
    assert len(sent) == 1 and w.improver is not None
    assert w.improver.stats["offered"] == 1  # the three left queued went to the improver
    assert w.improver.wait_idle(120)  # a bound on a hang: the child's start and a 0.01 s solve
    w.tick()  # GPU still leased: nothing starts, the same three are not solved again
    assert len(sent) == 1 and w.improver.stats["offered"] == 1
    w.close()


def test_background_improver_for_tardiness_adopts_by_weighted_tardiness(r, settings):
    batch, state = instance(6, 2, models=3, seed=4, gang=False)
    batch = [dataclasses.replace(j, deadline_s=round(j.release_s + 1.5 * j.service_s, 1)) for j in batch]
    floor = plan(batch, state, "tardiness-portfolio")  # weighted tardiness 1,193.2
    imp = BackgroundImprover("tardiness", time_limit_s=5)
    assert imp.objective == "weighted_tardiness"
    assert imp.offer(batch, state) and imp.wait_idle(30)
    got = imp.best(floor, batch, state)
    assert imp.stats["adopted"] == 1
    assert got.objective == pytest.approx(974.6) and got.objective < floor.objective  # exact search's optimum
    assert evaluate(got, batch, state, objective="weighted_tardiness").objective == pytest.approx(got.objective)
    imp.close()
    w = PlannerWorker(r, dataclasses.replace(settings, policy="tardiness"), ONE_GPU, dispatch=lambda *a: None)
    assert w.improver is not None and w.improver.objective == "weighted_tardiness"


# -- the child process: death, restart, shutdown ----------------------------------------------
def _gone(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` has exited (and been reaped, or is a zombie of a parent
    that is not ours to reap) within ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE and psutil.Process(pid).ppid() != os.getpid():
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _cmdline(proc: psutil.Process) -> list[str]:
    """``proc``'s command line, or [] once it has ended (psutil raises for a process gone or a zombie)."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _eventually(cond, timeout_s: float = 30.0) -> bool:
    """Whether ``cond()`` holds within ``timeout_s`` (the improver logs a failed solve on
    its pool thread just after it reports idle)."""
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _long_case():
    """A batch whose solve runs to its time limit (windowed LNS on 96 jobs, 16 GPUs)."""
    return instance(96, 16, models=6, seed=3, gang=False)


def test_improver_replaces_a_child_killed_mid_solve_then_one_killed_idle(caplog):
    batch, state, floor, best = _case()
    big, big_state = _long_case()
    imp = BackgroundImprover("default", time_limit_s=300)
    try:
        assert imp.offer(big, big_state)
        first = imp.child_pid()
        assert first is not None and first != os.getpid()
        time.sleep(0.5)  # the child has imported everything (the pid probe ran): it is solving
        assert not imp.wait_idle(0.0)
        os.kill(first, signal.SIGKILL)
        assert imp.wait_idle(60)  # the solve failed at once: not after its 300 s limit
        assert imp.stats["failed"] == 1 and imp.best(floor, batch, state) is floor
        assert _eventually(lambda: "child process died mid-solve" in caplog.text)  # logged after idle
        assert _gone(first, 10)  # reaped by the pool: no zombie left
        assert imp.offer(batch, state)  # a new child, on the next offer
        second = imp.child_pid()
        assert second not in (None, first) and imp.stats["restarts"] == 1
        assert imp.wait_idle(30) and imp.stats["failed"] == 1
        assert score(imp.best(floor, batch, state)) == score(best)  # the new child solved it
        os.kill(second, signal.SIGKILL)  # idle now: the next offer finds the pool broken
        assert _gone(second, 10)
        assert imp.offer(batch[1:], state)
        third = imp.child_pid()
        assert third not in (None, first, second) and imp.stats["restarts"] == 2
        assert imp.wait_idle(30) and imp.stats["failed"] == 1
    finally:
        imp.close()


class _Clock:
    """A clock the test moves (``now_s``, s), for the improver's watchdog."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_hung_child_is_killed_on_the_next_offer_and_replaced(monkeypatch, caplog):
    """A child stopped mid-solve (SIGSTOP: wedged, not dead) is killed by the first offer
    after ``hung_after_s`` — the same batch included — and the offer after starts a new one.
    The watchdog runs on the test's clock: the real time between the steps (seconds on a
    loaded host) counts for nothing."""
    import makespan.workers.improver as improver

    monkeypatch.setattr(improver, "HUNG_FACTOR", 1.0)
    monkeypatch.setattr(improver, "HUNG_SLACK_S", 2.0)
    batch, state, floor, best = _case()
    big, big_state = _long_case()
    clock = _Clock()
    imp = BackgroundImprover("default", time_limit_s=1.0, clock=clock)
    try:
        assert imp.hung_after_s() == 3.0
        assert imp.offer(big, big_state)
        first = imp.child_pid()
        assert first is not None
        os.kill(first, signal.SIGSTOP)
        assert not imp.offer(big, big_state) and imp.stats["hung"] == 0  # solving since its child started
        clock.now_s += 2.9
        assert not imp.offer(big, big_state) and imp.stats["hung"] == 0  # 2.9 s: not hung yet
        clock.now_s += 0.3
        assert not imp.wait_idle(0.0)  # stopped: its 1 s limit cannot end it
        assert not imp.offer(big, big_state)  # the same batch: the watchdog still looks
        assert imp.stats["hung"] == 1 and "killing its child process" in caplog.text
        assert imp.wait_idle(60) and imp.stats["failed"] == 1
        assert _gone(first, 30)
        assert imp.offer(batch, state)
        second = imp.child_pid()
        assert second not in (None, first) and imp.stats["restarts"] == 1
        assert imp.wait_idle(120) and score(imp.best(floor, batch, state)) == score(best)
    finally:
        imp.close()


def test_close_mid_solve_kills_the_child_at_once():
    big, big_state = _long_case()
    imp = BackgroundImprover("default", time_limit_s=300)
    assert imp.offer(big, big_state)
    pid = imp.child_pid()
    time.sleep(0.5)
    assert pid is not None and not imp.wait_idle(0.0)
    t0 = time.monotonic()
    imp.close()
    assert time.monotonic() - t0 < 60.0  # not the 300 s limit (a bound that load cannot reach)
    assert _gone(pid, 10.0) and imp.stats["failed"] == 0  # abandoned, not failed


def test_planner_worker_stop_ends_its_improver_child(r, keys, settings):
    """run() in a thread with the improver's child started by a tick; stop() makes run()
    return, and run() ends and reaps the child."""
    settings = dataclasses.replace(settings, solve_time_limit_s=0.01)
    w = PlannerWorker(r, settings, ONE_GPU, dispatch=lambda ctx, q: None)
    prod = Producer(r, keys, ONE_GPU, settings)
    for i in range(4):
        prod.submit({"endpoint": "e", "service_s": 10 + i})
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    end = time.monotonic() + 30
    while w.improver.child_pid(0.0) is None and time.monotonic() < end:
        time.sleep(0.05)
    pid = w.improver.child_pid()
    assert pid is not None and psutil.Process(pid).ppid() == os.getpid()
    assert psutil.Process(pid).nice() == min(19, os.nice(0) + settings.improver_nice)  # the tick first
    w.stop()
    t.join(15)
    assert not t.is_alive()
    with pytest.raises(psutil.NoSuchProcess):  # exited and reaped: not even a zombie
        psutil.Process(pid).status()


def test_killed_planner_process_leaves_no_improver_child(r, keys, settings, tmp_path):
    """A planner process (the CLI) is SIGKILLed, its process group spared: its improver
    child notices the parent is gone and exits by itself."""
    fleet = tmp_path / "one.toml"
    fleet.write_text('name = "one"\n[[hosts]]\nname = "h"\ngpu_count = 1\nmemory_mib = 81920\n'
                     '[endpoints.e]\nmodel = "m"\nmemory_mib_per_gpu = 20000\ncold_start_s = 1\n')
    s = dataclasses.replace(settings, solve_time_limit_s=0.01)
    env = {**os.environ, **s.to_env()}
    cli = [sys.executable, "-c", "from makespan.cli import app; app()", "planner", "--fleet", str(fleet)]
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        prod = Producer(r, keys, ONE_GPU, s)
        for i in range(4):
            prod.submit({"endpoint": "e", "service_s": 10 + i})
        end = time.monotonic() + 180  # bounds on a hang: a CLI start and a spawned child on a loaded host
        kids: list = []  # the improver's child, and multiprocessing's resource tracker

        def spawned() -> bool:  # a child listed may have ended (or be a zombie) before its cmdline is read
            return any("spawn_main" in " ".join(_cmdline(k)) for k in kids)
        while not spawned() and time.monotonic() < end:
            assert proc.poll() is None, proc.stderr.read().decode()
            kids = psutil.Process(proc.pid).children()
            time.sleep(0.1)
        assert spawned(), kids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert all(_gone(k.pid, 60) for k in kids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
