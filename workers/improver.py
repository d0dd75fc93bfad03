"""The default policy's CP-SAT improver, off the live planner's tick path.

The live planner must answer within a tick (tens of milliseconds: a GPU that frees is
leased again at once), while the CP-SAT improver of the ``default`` policy needs up to
``solve_time_limit_s`` (1 s) per batch. So the planner worker splits the policy:

* every tick plans with the greedy ``portfolio`` (the default policy's floor) and adopts
  the improver's latest plan instead when, adapted to the current batch and fleet state
  (:func:`adapt`) and replayed by the evaluator, it scores better;
* after a tick whose batch differs from the last one sent, it hands that batch, the fleet
  state and its own last plan to one long-lived child process, which runs the ``default``
  policy (portfolio + exact search / whole-batch CP-SAT / descent and windowed LNS) within
  the time limit, starting from that last plan when, repaired to the batch, it is better.

So the live worker runs the same planner as the simulator's ``default`` policy, one tick
late. The solve runs in a child process (``executor="process"``, the default: a
``ProcessPoolExecutor`` of one worker, started with ``spawn`` — the planner holds Redis
connections and threads, which a fork would copy), so its Python parts (portfolio,
repair, descent, decoding windows) no longer take the tick's GIL; ``executor="thread"``
runs it on a thread of the planner process, as before. Batch, fleet state and plans
cross as pickles (about 45 kB and 1 ms each way for 256 jobs on 32 GPUs).

A process removes the GIL, not the competition for CPU: where the planner's host has a
spare core the child takes it; where the CPU is busy, the child and the tick share it.
The child therefore runs at an added niceness (``child_nice``; the live planner's
``Settings.improver_nice``, default 5), so that the tick comes first and the solve gets
less done within its limit. On the shared 2-core machine of 2026-11-30 (load 2.4–5.3),
the portfolio tick on 256 jobs/32 GPUs took, at p50, 1.6–4.0 × its time alone beside a
thread's solve, 1.7–3.3 × beside a child at nice 0, 1.16–1.77 × at nice 5 and
1.05–1.35 × at nice 10 (``bench/planner_tick.py --beside-solve``; bench/RESULTS.md, "The
live improver: thread or process"): there the CPU, not the GIL, was what the tick lacked.

The child starts on the first offer (about 1.4 s of imports, in the child; about 100 MiB
resident after a 256-job solve) and, being spawned, imports the program's main module
again: a script that uses the improver must guard its entry point (``if __name__ ==
"__main__":``; the CLI, ``python -m makespan.cli`` and pytest do), or no child starts and
each offer logs why and leaves the greedy plan. It ignores SIGINT (the planner ends it)
and exits by itself when the planner process dies (it waits on its parent's sentinel).
When it dies (killed, out of memory) the solve in flight fails: the improver logs it,
counts ``failed`` and starts a new child on the next offer; the tick keeps its greedy
plan. A solve still running ``HUNG_FACTOR`` × its time limit + ``HUNG_SLACK_S`` after it
started (a stopped or wedged child: CP-SAT honours its limit, so a healthy solve ends
near it) is hung: the next offer kills that child (SIGKILL, counted as ``hung``; the
solve then fails as above) and a later offer starts a new one, so a wedged child does
not leave the planner on its greedy plan for good. A solve counts as started when it
was submitted *and* its child had started (the child's pid probe answered): a child's
start (imports; tens of seconds on a loaded host) is not solve time. The watchdog reads
the improver's clock (``clock``, default ``time.monotonic``; tests pass their own).
:meth:`BackgroundImprover.close` kills a solve in flight and joins the child;
``PlannerWorker.run`` calls it on its way out. An improved plan can only be adopted
when it is better on the state of the tick that uses it: it is never worse than the
greedy floor.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

from makespan import metrics
from makespan.errors import ValidationError
from makespan.settings import IMPROVER_EXECUTORS, IMPROVER_NICE_MAX
from makespan.planner.api import plan as run_policy
from makespan.planner.evaluator import score
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.planner.policies import POLICY_REGISTRY
from makespan.planner.previous import repair

log = logging.getLogger("makespan.planner")
HORIZON_FACTOR = 10.0  # solve only when the tick's plan spans at least this many time limits
CHILD_START_S = 30.0  # longest wait for a new child to start (imports: about 1.4 s alone), s
HUNG_FACTOR = 5.0  # a solve running this many time limits (+ HUNG_SLACK_S) is hung: its child is killed
HUNG_SLACK_S = 60.0  # room for the child's start and the pickles on a loaded host, s


def _child_init(nice: int) -> None:
    """First thing the child process runs: lower its CPU priority by ``nice`` (0: none),
    ignore SIGINT and SIGTERM (a Ctrl-C, or systemd's stop with ``KillMode=control-group``,
    reaches the whole process group; the planner then ends the child itself: a child that
    died first logged "its child process died mid-solve" at ERROR on a normal stop, an
    upgrade tester) and exit as soon as the parent process is gone (a SIGKILLed planner
    cannot end it)."""
    if nice > 0:
        os.nice(nice)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), name="makespan-improver-parent",
                         daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # ready when the parent process has ended
    os._exit(0)


def _pid_of(probe: Future | None, timeout_s: float) -> int | None:
    """The child's pid from its ``os.getpid`` probe, or None (no probe, or it did not run
    within ``timeout_s``)."""
    try:
        return probe.result(timeout_s) if probe is not None else None
    except Exception:  # noqa: BLE001 - a child that died starting has no pid to report
        return None


def _solve(batch: list[PlanJob], state: FleetState, policy: str, time_limit_s: float,
           num_workers: int | None, previous: Plan | None) -> tuple[Plan, float]:
    """One improver solve (in the child process or thread): the plan of ``policy`` and
    its wall time, s."""
    t0 = time.perf_counter()
    out = run_policy(batch, state, policy, time_limit_s=time_limit_s, num_workers=num_workers, previous=previous)
    return out, time.perf_counter() - t0


def adapt(previous: Plan, batch: Sequence[PlanJob], state: FleetState,
          objective: str = "weighted_completion") -> Plan | None:
    """``previous`` repaired to ``batch`` on ``state`` (:func:`makespan.planner.previous.repair`: its
    jobs still in the batch keep their start order and GPU group and start as early as the
    replay allows; the others follow in WSPT order, each on the group completing it
    earliest). Returns the plan evaluated for ``objective`` (policy ``"improved"``), or
    None when no job of the batch is in ``previous``."""
    ids = {j.id for j in batch}
    if not any(a.job_id in ids for a in previous.assignments):
        return None
    return repair(previous, batch, state, policy="improved", objective=objective)


class BackgroundImprover:
    """Runs ``policy`` (``default``/``cpsat``/``tardiness``) on the batches it is offered,
    at most one at a time, in one child process (or thread); the newest result is kept
    for :meth:`best`, which compares plans by the policy's objective
    (:attr:`makespan.planner.policies.Policy.objective`; the floor must be scored for it too).

    Args:
        policy: the name of a policy with :attr:`makespan.planner.policies.Policy.improver`.
        time_limit_s: its time limit per batch, s.
        num_workers: CP-SAT search workers.
        executor: ``"process"`` (default) or ``"thread"`` (module doc).
        child_nice: niceness added to the child process (``process`` only; 0: none;
            the live planner's is ``Settings.improver_nice``, module doc).
        clock: the hung-solve watchdog's clock, s (monotonic; default ``time.monotonic``).

    Raises:
        ValidationError: an unknown ``executor``.

    ``stats``: ``offered`` (batches solved), ``adopted`` (ticks that used the improved
    plan), ``busy_skips`` (batches not offered because a solve was running),
    ``short_skips`` (batches whose plan ended too soon to be worth a solve),
    ``failed`` (solves that raised or whose child died), ``restarts`` (children started
    after the first), ``hung`` (children killed for a solve past
    :meth:`hung_after_s`, module doc).
    """

    def __init__(self, policy: str, time_limit_s: float, num_workers: int | None = None,
                 executor: str = "process", child_nice: int = 0, clock: Callable[[], float] = time.monotonic):
        if executor not in IMPROVER_EXECUTORS:
            raise ValidationError("improver_executor", executor, f"must be one of {', '.join(IMPROVER_EXECUTORS)}")
        if not 0 <= child_nice <= IMPROVER_NICE_MAX:
            raise ValidationError("improver_nice", child_nice, f"must be between 0 and {IMPROVER_NICE_MAX}")
        self.policy, self.time_limit_s, self.num_workers = policy, time_limit_s, num_workers
        self.executor, self.child_nice, self._clock = executor, child_nice, clock
        self.objective = POLICY_REGISTRY.lookup(policy).objective
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False
        self._pool: Executor | None = None
        self._pool_broken = False
        self._pid: Future | None = None  # the child's pid (process executor)
        self._result: Plan | None = None
        self._last_ids: tuple[str, ...] = ()
        self._started = 0.0  # clock() when the solve in flight was submitted
        self._child_ready_at: float | None = None  # clock() when the current child answered its pid probe
        self.stats = {"offered": 0, "adopted": 0, "busy_skips": 0, "short_skips": 0, "failed": 0, "restarts": 0,
                      "hung": 0}

    def hung_after_s(self) -> float:
        """How long a solve may run before it counts as hung (module doc), s."""
        return HUNG_FACTOR * self.time_limit_s + HUNG_SLACK_S

    def worth_solving(self, horizon_s: float) -> bool:
        """Whether a plan ending ``horizon_s`` wall seconds from now is worth a solve: at
        least ``HORIZON_FACTOR × time_limit_s`` (a plan whose decisions all fall within a
        few solve times gains nothing from a solve that a later tick can only adopt after
        them, e.g. a stream of sub-second jobs). Counts ``short_skips``."""
        if horizon_s < HORIZON_FACTOR * self.time_limit_s:
            self.stats["short_skips"] += 1
            return False
        return True

    def _executor(self) -> Executor:
        """The worker pool, started now when there is none or its child died (caller
        holds ``_lock``)."""
        if self._pool is not None and self._pool_broken:
            log.warning("background improver: its child process died; starting a new one")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self.stats["restarts"] += 1
        if self._pool is None:
            self._pool_broken = False
            if self.executor == "thread":
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="makespan-improver")
            else:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_child_init, initargs=(self.child_nice,))
                self._child_ready_at = None
                self._pid = self._pool.submit(os.getpid)  # runs first: starts the child, learns its pid
                self._pid.add_done_callback(self._child_ready)
        return self._pool

    def offer(self, batch: Sequence[PlanJob], state: FleetState) -> bool:
        """Start improving ``batch`` on ``state`` unless a solve is running, this batch
        (the same job ids) was the last one offered, or the improver is closed. Returns
        whether a solve started. Never raises for a dead child: it is replaced."""
        ids = tuple(sorted(j.id for j in batch))
        probe: Future | None = None
        with self._lock:
            if self._closed:
                return False
            if self._busy:  # checked for a hung solve even when the batch is unchanged
                if self.executor == "process" and self._solving_s() > self.hung_after_s():
                    probe = self._pid
                elif ids != self._last_ids:
                    self.stats["busy_skips"] += 1
                if probe is None:
                    return False
        if probe is not None:
            self._kill_hung(probe)
            return False
        with self._lock:
            if self._closed or self._busy or ids == self._last_ids:
                return False
            args = (list(batch), state, self.policy, self.time_limit_s, self.num_workers, self._result)
            try:
                try:
                    fut = self._executor().submit(_solve, *args)
                except BrokenExecutor:  # the child died while idle: replace it now
                    self._pool_broken = True
                    fut = self._executor().submit(_solve, *args)
            except Exception:  # noqa: BLE001 - no child could start: the tick keeps its greedy plan
                log.exception("background improver could not start a solve; the greedy plan is used")
                self._pool_broken = self._pool is not None  # try a new child on the next offer
                self.stats["failed"] += 1
                return False
            self._busy, self._last_ids, self._started = True, ids, self._clock()
            self.stats["offered"] += 1
        fut.add_done_callback(self._done)
        return True

    def _child_ready(self, probe: Future) -> None:
        """The child answered its pid probe (in the pool's thread): it has started. A plain
        attribute write, without the lock: the callback may run in the thread that holds it."""
        if not probe.cancelled() and probe.exception() is None:
            self._child_ready_at = self._clock()

    def _solving_s(self) -> float:
        """How long the solve in flight has run (caller holds ``_lock``), s: since it was
        submitted or its child started, whichever is later; 0 while its child is starting."""
        ready_at = self._child_ready_at
        if ready_at is None and self._pid is not None and self._pid.done() and not self._pid.cancelled():
            ready_at = self._child_ready_at = self._clock()  # answered; its callback has not run yet
        if ready_at is None:
            return 0.0
        return self._clock() - max(self._started, ready_at)

    def _done(self, fut: Future) -> None:
        """A solve ended (in the pool's own thread): keep its plan, or say why there is none."""
        err: BaseException | None = None
        with self._lock:
            self._busy = False
            if fut.cancelled():
                self._last_ids = ()
                return
            err = fut.exception()
            if err is None:
                out, solve_s = fut.result()
                self._result = out  # before wait_idle() sees the improver idle
            else:
                self._last_ids = ()  # the same batch may be offered again
                self._pool_broken = isinstance(err, BrokenExecutor)
                self.stats["failed"] += 0 if self._closed else 1  # close() abandons a solve: no failure
            closed = self._closed
        if err is None:
            metrics.improver("solved", solve_s)
        elif not closed:  # the tick's greedy plan stands; say why
            metrics.improver("failed")
            if isinstance(err, BrokenExecutor):
                log.error("background improver: its child process died mid-solve (%s); the greedy plan is "
                          "used, and the next offer starts a new child", err)
            else:
                log.error("background improver failed; the greedy plan is used", exc_info=err)

    def _kill_hung(self, probe: Future) -> None:
        """SIGKILL the child of a hung solve (module doc); its future then fails as a died
        child's does and the next offer starts a new one."""
        pid = _pid_of(probe, 0.0)
        if pid is None:
            return
        log.error("background improver: a solve has run over %.0f s (limit %.3g s); killing its child process %d",
                  self.hung_after_s(), self.time_limit_s, pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        with self._lock:
            self.stats["hung"] += 1
        metrics.improver("hung")

    def child_pid(self, timeout_s: float = CHILD_START_S) -> int | None:
        """The pid of the current child process (waits up to ``timeout_s`` for it to
        start), or None (thread executor, no child started yet, or it did not start)."""
        with self._lock:
            probe = self._pid if self.executor == "process" and self._pool is not None else None
        return _pid_of(probe, timeout_s)

    def close(self) -> None:
        """End the worker: no further offers; a solve in flight is abandoned (its child is
        killed, as its result could no longer be used; a thread's solve runs on to its
        time limit) and the child joined. Idempotent. Safe from any thread, not from a
        signal handler (it takes the improver's lock)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            busy, probe = self._busy, self._pid
        if pool is None:
            return
        if busy and self.executor == "process":
            pid = _pid_of(probe, CHILD_START_S)  # the probe runs before the solve
            if pid is not None:
                try:  # not reaped yet: the pool joins its child only in shutdown() below
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pool.shutdown(wait=True, cancel_futures=True)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no solve runs, at most ``timeout_s`` (0: look once). Returns
        whether it is idle."""
        end = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._busy:
                    return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)

    def best(self, floor: Plan, batch: Sequence[PlanJob], state: FleetState) -> Plan:
        """``floor`` (the tick's greedy plan), or the latest improved plan adapted to this
        batch and state when it scores strictly better."""
        with self._lock:
            prev = self._result
        if prev is None:
            return floor
        cand = adapt(prev, batch, state, self.objective)
        if cand is None or score(cand) >= score(floor) - 1e-6 * max(1.0, abs(score(floor))):
            return floor
        self.stats["adopted"] += 1
        metrics.improver("adopted")
        cand.stats["greedy_score"] = score(floor)
        return cand
