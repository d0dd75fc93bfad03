"""Gantt charts and text summaries from a run's recorded events.

Input: the recorded events of the live system (the ``P:events`` stream, or a run
directory's ``events.jsonl``), each a dict such as::

    {"ts": 1718000000.25, "kind": "phase_start", "job": "j-1", "lease": "l-1",
     "phase": "execute", "gpus": ["GPU-host-a-0"], "host": "host-a",
     "endpoint": "coder", "priority": "HIGH", "planned_s": 30.0, "time_scale": 0.01}

``ts`` is unix wall time in seconds. A phase becomes a bar from its
``phase_start`` (or ``restore_start``) to the matching ``phase_end`` (or
``restore_end``), matched on (lease or job, phase); a phase still open at the end
of the record is drawn up to the last event and counted as incomplete.

Measures follow the design notes ("Measures"): waits are start − submission,
makespan is last completion − first submission, utilization is execute
GPU-seconds / (GPUs × makespan). All times here are wall seconds; divide by the
events' ``time_scale`` for workload seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

from makespan.errors import ValidationError
from makespan.models import Priority

PHASES = ("evict", "start_endpoint", "execute", "clear", "restore")
TRANSITION_PHASES = ("evict", "start_endpoint", "clear", "restore")
# Evict, restore and the transitions below take Okabe & Ito's colour-blind-safe palette
# (vermillion, yellow; reddish purple, orange, blue), no two alike and none equal to a
# phase colour, so sleep, wake, cold start, evict and restore read apart (issue 20).
PHASE_COLOURS = {
    "evict": "#d55e00",
    "start_endpoint": "#92c5de",
    "execute": "#4daf4a",
    "clear": "#d9d9d9",
    "restore": "#f0e442",
}
# A transition phase's bar takes the colour of what it did (the phase_end event's
# ``transition`` field): a sleep instead of a stop, a wake instead of a cold start.
TRANSITION_COLOURS = {
    "sleep": "#cc79a7",
    "wake": "#e69f00",
    "cold_start": "#0072b2",
}
# A transition bar is drawn at least this fraction of the chart's time span wide (about
# 7 pixels of a default chart), so an 8 s wake in a 57,000 s run still shows; other bars
# at least MIN_BAR_FRACTION.
MIN_TRANSITION_FRACTION = 0.008
MIN_BAR_FRACTION = 0.002
TRANSITIONS = tuple(TRANSITION_COLOURS)
# a phase_end's per-endpoint transition kinds as summary_stats counts them: a level-2 wake is
# a wake, a restore lease's load a cold start (said apart as restore_cold_starts)
_SUMMARY_KIND = {"wake_level2": "wake", "restore": "cold_start"}
PRIORITY_EDGES = {"CRITICAL": "#b2182b", "HIGH": "#e66101", "NORMAL": "#2166ac", "LOW": "#404040"}
PRIORITY_HATCH = {"CRITICAL": "///", "HIGH": "\\\\", "NORMAL": "", "LOW": ".."}
# endpoint colours, given to a run's endpoints in sorted name order: matplotlib's tab10
# without its green (too close to the execute phase), plus a dark blue
ENDPOINT_PALETTE = ("#1f77b4", "#ff7f0e", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                    "#7f7f7f", "#393b79")
NO_ENDPOINT = "(none)"
_OPEN = {"phase_start", "restore_start"}
_CLOSE = {"phase_end", "restore_end"}


@dataclass(frozen=True)
class Interval:
    """One phase on a GPU group, in wall seconds since the first event."""

    phase: str
    gpus: tuple[str, ...]
    start_s: float
    end_s: float
    job: str | None
    priority: str | None
    endpoint: str | None
    complete: bool
    transition: str | None = None  # sleep, wake, cold_start (or evict) where the phase said so
    #: why an incomplete phase ended: ``preempted`` (its lease was preempted: the planner gave
    #: the GPUs to a more urgent job and queued this one again), ``reclaimed`` (its lease
    #: expired: a worker stopped renewing it), ``handed_back`` (its GPU worker stopped cleanly,
    #: SIGTERM, and handed the lease back: the job was requeued, no attempt counted), ``ended`` (its lease ended without the phase's
    #: end: its job failed, was cancelled or scheduled a retry in it) or ``open_at_end`` (still
    #: running when the record ends)
    cut_by: str | None = None


def load_events(path: str | Path, on_cut_tail: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Read a JSON-lines events file (blank lines skipped), sorted by ``ts``.

    ``on_cut_tail``: when given, a last line that does not parse and has no line break
    after it (the file was cut off while being written: the run was killed, the disk
    filled) is left out and ``on_cut_tail`` called with a one-line notice naming it;
    without it, as any other bad line.

    Raises:
        ValidationError: the file cannot be read (missing, a folder, not UTF-8), or a
            line is not a JSON object with a finite numeric ``ts`` and a ``kind``
            (field ``events.jsonl:{line}``); the error names the file (``source``).
    """
    from makespan.models import read_user_file

    text = read_user_file(path, "events file")
    lines = text.split("\n")
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            try:
                ev = json.loads(line)
            except (ValueError, RecursionError) as e:
                if on_cut_tail is not None and n == len(lines):  # no line break after it
                    on_cut_tail(f"{path}: line {n} is cut off ({line[:40]!r}...): left out; the other "
                                f"{n - 1} lines are read")
                    continue
                raise ValidationError(f"events.jsonl:{n}", line[:80], "not JSON") from e
            _check_event(ev, f"events.jsonl:{n}")
        except ValidationError as e:
            raise e.in_file(path) from None
        out.append(ev)
    out.sort(key=lambda e: e["ts"])
    return out


def read_stream_events(client, stream_key: str, count: int | None = None) -> list[dict[str, Any]]:
    """Read recorded events from the Redis stream ``stream_key`` (field ``e`` holds JSON).

    ``client`` is a redis-py client (decoded or not). Entries that do not parse are skipped.
    """
    out = []
    for _id, fields in client.xrange(stream_key, count=count):
        raw = fields.get("e", fields.get(b"e"))
        if raw is None:
            continue
        try:
            ev = json.loads(raw)
            _check_event(ev, "stream")
        except (ValueError, ValidationError):
            continue
        out.append(ev)
    out.sort(key=lambda e: e["ts"])
    return out


def _check_event(ev: Any, where: str) -> None:
    if not isinstance(ev, dict):
        raise ValidationError(where, ev, "an event must be a JSON object")
    ts = ev.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        raise ValidationError(f"{where}.ts", ts, "must be unix seconds (a finite number)")
    if not isinstance(ev.get("kind"), str):
        raise ValidationError(f"{where}.kind", ev.get("kind"), "must be a string")


_LEASE_LOST = ("preempted", "reclaimed")
# the lease's own end, written by its holder in the same fenced commit that releases it: a
# phase that failed, was cancelled or scheduled a retry has no phase_end (its lease ends here)
_LEASE_ENDED = ("failed", "cancelled", "retry_scheduled", "restore_end")


def _phase_of(ev: dict[str, Any]) -> str:
    if ev["kind"] in ("restore_start", "restore_end"):
        return "restore"
    return str(ev.get("phase") or "")


def _match_key(ev: dict[str, Any]) -> tuple[str, str]:
    owner = ev.get("lease") or ev.get("job") or ("gpus:" + ",".join(ev.get("gpus") or []))
    return str(owner), _phase_of(ev)


def intervals(events: Iterable[dict[str, Any]]) -> list[Interval]:
    """Phase intervals from ``events`` (any order), times relative to the first event."""
    evs = sorted(events, key=lambda e: e["ts"])
    if not evs:
        return []
    t0, t_last = evs[0]["ts"], evs[-1]["ts"]
    prio: dict[str, str] = {}
    for ev in evs:
        if ev.get("job") and ev.get("priority"):
            prio.setdefault(ev["job"], str(ev["priority"]))
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    out: list[Interval] = []

    def close(start: dict[str, Any], end_ts: float, end: dict[str, Any] | None, cut_by: str | None = None) -> None:
        job = start.get("job") or (end or {}).get("job")
        gpus = tuple(start.get("gpus") or (end or {}).get("gpus") or ())
        out.append(Interval(
            phase=_phase_of(start), gpus=gpus, start_s=start["ts"] - t0, end_s=end_ts - t0, job=job,
            priority=start.get("priority") or (prio.get(job) if job else None),
            endpoint=start.get("endpoint") or (end or {}).get("endpoint"), complete=end is not None,
            transition=(end or {}).get("transition"), cut_by=cut_by))

    ended: dict[str, str] = {}  # lease -> why it ended (cut_by of a phase start stamped after it)
    for ev in evs:
        if ev["kind"] in _OPEN:
            key = _match_key(ev)
            if key in open_:  # a repeated start (redelivered task): keep the first
                continue
            if ev.get("lease") in ended and ev["kind"] == "phase_start":
                # stamped (its writer's clock) just before the end that a second process stamped
                # earlier but wrote later (a preemption racing the phase's start): no time on the GPUs
                close(ev, ev["ts"], None, cut_by=ended[ev["lease"]])
                continue
            open_[key] = ev
        elif ev["kind"] in _CLOSE:
            start = open_.pop(_match_key(ev), None)
            if start is not None:
                close(start, ev["ts"], ev)
        if ev["kind"] in (*_LEASE_LOST, *_LEASE_ENDED) and ev.get("lease"):
            # a preempted or reclaimed lease, or one whose job failed, was cancelled or
            # scheduled a retry mid-phase: its open phases stop here (drawn as incomplete)
            lost = ev["lease"]
            why = ev["kind"] if ev["kind"] in _LEASE_LOST else "ended"
            if why == "reclaimed" and ev.get("cause") == "worker_shutdown":  # a clean stop, not a crash
                why = "handed_back"
            ended[lost] = why
            for key in [k for k in open_ if k[0] == lost]:
                close(open_.pop(key), min(ev["ts"], ev.get("expired_at") or ev["ts"]), None, cut_by=why)
    for start in open_.values():
        close(start, t_last, None, cut_by="open_at_end")
    out.sort(key=lambda i: (i.start_s, i.phase))
    return out


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), ``q`` in [0, 100]."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _transition_counts(evs: list[dict[str, Any]]) -> tuple[dict[str, int], int]:
    """({sleep, wake, cold_start: endpoints put to sleep, woken or loaded}, how many of the
    cold starts were restore or prewarm leases'), from each ``phase_end``'s per-endpoint
    ``transitions`` list as the demo's report counts them (an evict that put two endpoints
    to sleep is two sleeps); an event written before that list counts its ``transition``."""
    counts = {t: 0 for t in TRANSITIONS}
    restores = 0
    for ev in evs:
        if ev["kind"] != "phase_end":
            continue
        entries = ev.get("transitions")
        if entries:
            for entry in entries:
                kind = _SUMMARY_KIND.get(entry.get("kind"), entry.get("kind"))
                if kind in counts:
                    counts[kind] += 1
                    restores += kind == "cold_start" and (entry.get("kind") == "restore" or not ev.get("job"))
        elif ev.get("transition") in counts:
            counts[ev["transition"]] += 1
            restores += not ev.get("job") and ev["transition"] == "cold_start"  # a restore or prewarm lease
    return counts, restores


def summary_stats(events: list[dict[str, Any]], gpus: list[str] | None = None) -> dict[str, Any]:
    """Measures of the design notes computed from recorded events (wall seconds).

    Returns a dict: ``jobs`` (counts by kind), ``completed_by_priority``,
    ``makespan_s``, ``weighted_completion_s``, ``wait_s`` ({priority: {p50, p95, n}}),
    ``phase_gpu_s`` ({phase: GPU-seconds}), ``phase_count``, ``transition_count``
    ({sleep, wake, cold_start: endpoints put to sleep, woken or loaded, from each phase's
    per-endpoint ``transitions`` list as the demo's and replay's reports count them,
    set-point restores included}),
    ``restore_cold_starts`` (of those cold starts, the ones of leases without a job: set-point
    restores and prewarms, which the report JSON of a live run counts under
    ``transitions.restore`` and ``transitions.prewarm``), ``sleep_level_count``
    ({level1, level2: instances put to sleep at that level, from the evict phases'
    ``slept_levels``}), ``busy_gpu_s``,
    ``transition_gpu_s``, ``idle_gpu_s``, ``utilization``, ``weighted_tardiness_s``
    (Σ w·max(0, C − d) in weight·wall s over the completed jobs whose ``submitted`` event
    carries ``deadline_s``: d = submission + ``deadline_s`` × the record's time scale, as the
    tardiness policies plan; docs/planner.md), ``tardy_jobs`` and ``jobs_with_deadline`` (of
    those completed jobs), ``gpus``, ``incomplete`` (phases
    without their end event), ``cut_short`` (those by why: ``{preempted, reclaimed,
    handed_back, ended, open_at_end}``, see :attr:`Interval.cut_by`), ``drains``, ``time_scale``. ``gpus`` defaults to every GPU named in the events.
    """
    evs = sorted(events, key=lambda e: e["ts"])
    ivs = intervals(evs)
    gpu_set = list(gpus) if gpus else sorted({g for ev in evs for g in (ev.get("gpus") or [])})
    kinds = ("submitted", "leased", "completed", "failed", "requeued", "cancelled", "preempted")
    jobs = {k: sum(1 for ev in evs if ev["kind"] == k) for k in kinds}
    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    completed: dict[str, float] = {}
    prio: dict[str, str] = {}
    deadline_s: dict[str, float] = {}  # workload s after submission, from the submitted event
    for ev in evs:
        job = ev.get("job")
        if not job:
            continue
        if ev.get("priority"):
            prio.setdefault(job, str(ev["priority"]))
        if ev["kind"] == "submitted":
            submitted.setdefault(job, ev["ts"])
            if isinstance(ev.get("deadline_s"), (int, float)):
                deadline_s.setdefault(job, float(ev["deadline_s"]))
        elif ev["kind"] in ("leased", "phase_start") and job not in started:
            started[job] = ev["ts"]
        elif ev["kind"] == "completed":
            completed[job] = ev["ts"]
    waits: dict[str, list[float]] = {}
    for job, t_start in started.items():
        if job in submitted:
            waits.setdefault(prio.get(job, "NORMAL"), []).append(t_start - submitted[job])
    wait_s = {p: {"p50": _percentile(w, 50), "p95": _percentile(w, 95), "n": len(w)}
              for p, w in sorted(waits.items(), key=lambda kv: _prio_rank(kv[0]))}
    makespan_s = 0.0
    if completed:
        first = min(submitted.values()) if submitted else evs[0]["ts"]
        makespan_s = max(completed.values()) - first
    weighted = 0.0
    for job, c in completed.items():
        if job in submitted:
            weighted += _weight(prio.get(job)) * (c - submitted[job])
    phase_gpu_s = {p: 0.0 for p in PHASES}
    phase_count = {p: 0 for p in PHASES}
    for iv in ivs:
        if iv.phase in phase_gpu_s:
            phase_gpu_s[iv.phase] += (iv.end_s - iv.start_s) * max(1, len(iv.gpus))
            phase_count[iv.phase] += 1
    transition_count, restore_cold_starts = _transition_counts(evs)
    sleep_level_count = {"level1": 0, "level2": 0}
    for ev in evs:
        if ev["kind"] == "phase_end" and ev.get("phase") == "evict":
            for level in (ev.get("slept_levels") or {}).values():
                if f"level{level}" in sleep_level_count:
                    sleep_level_count[f"level{level}"] += 1
    busy = phase_gpu_s["execute"]
    transition = sum(phase_gpu_s[p] for p in TRANSITION_PHASES)
    capacity = len(gpu_set) * makespan_s
    completed_by_priority: dict[str, int] = {}
    for job in completed:
        p = prio.get(job, "NORMAL")
        completed_by_priority[p] = completed_by_priority.get(p, 0) + 1
    ts = [ev["time_scale"] for ev in evs if isinstance(ev.get("time_scale"), (int, float))]
    wall_per_workload_s = float(ts[-1]) if ts else 1.0
    due = {job: submitted[job] + d * wall_per_workload_s for job, d in deadline_s.items()
           if job in completed and job in submitted}
    late = [_weight(prio.get(job)) * (completed[job] - d) for job, d in due.items() if completed[job] > d]
    return {
        "jobs": jobs,
        # completed jobs whose submission the record does not hold: it starts mid-run (a capped
        # events stream: MAKESPAN_EVENTS_MAX_LEN); their waits and weighted completion are not counted
        "completed_unsubmitted": sum(1 for job in completed if job not in submitted),
        # phases (jobs' and restores') that end in the record but began before it: a cut record too
        "ends_unstarted": _ends_unstarted(evs),
        "completed_by_priority": dict(sorted(completed_by_priority.items(), key=lambda kv: _prio_rank(kv[0]))),
        "makespan_s": makespan_s,
        "weighted_completion_s": weighted,
        "wait_s": wait_s,
        "phase_gpu_s": phase_gpu_s,
        "phase_count": phase_count,
        "transition_count": transition_count,
        "restore_cold_starts": restore_cold_starts,
        "sleep_level_count": sleep_level_count,
        "busy_gpu_s": busy,
        "transition_gpu_s": transition,
        "idle_gpu_s": max(0.0, capacity - busy - transition),
        "utilization": busy / capacity if capacity > 0 else 0.0,
        "weighted_tardiness_s": sum(late),
        "tardy_jobs": len(late),
        "jobs_with_deadline": len(due),
        "gpus": len(gpu_set),
        "incomplete": sum(1 for iv in ivs if not iv.complete),
        "cut_short": {why: sum(1 for iv in ivs if iv.cut_by == why) for why in ("preempted", "reclaimed", "handed_back",
                                                                                   "ended",
                                                                                   "open_at_end")},
        "drains": sum(1 for ev in evs if ev["kind"] == "drain"),
        "time_scale": ts[-1] if ts else None,
    }


def _ends_unstarted(evs: list[dict[str, Any]]) -> int:
    """``phase_end`` and ``restore_end`` events whose start (``phase_start`` of the same lease
    and phase, ``restore_start`` of the lease) is not in ``evs``: the record began after it."""
    started = {(ev.get("lease"), ev.get("phase")) for ev in evs if ev["kind"] == "phase_start"}
    started |= {(ev.get("lease"), "restore") for ev in evs if ev["kind"] == "restore_start"}
    return sum(1 for ev in evs
               if (ev["kind"] == "phase_end" and (ev.get("lease"), ev.get("phase")) not in started)
               or (ev["kind"] == "restore_end" and (ev.get("lease"), "restore") not in started))


def _prio_rank(name: str) -> int:
    return Priority[name].value if name in Priority.__members__ else 99


def _weight(name: str | None) -> int:
    return Priority[name].weight if name in Priority.__members__ else Priority.NORMAL.weight


def summarize(events: list[dict[str, Any]], gpus: list[str] | None = None) -> str:
    """A short plain-text report of :func:`summary_stats` (wall seconds)."""
    s = summary_stats(events, gpus)
    j = s["jobs"]
    lines = [
        f"events: {len(events)}  GPUs: {s['gpus']}"
        + (f"  time scale: {s['time_scale']:g} wall s per workload s" if s["time_scale"] else ""),
        f"jobs: submitted {j['submitted']}, completed {j['completed']}, failed {j['failed']}, "
        f"requeued {j['requeued']}, preempted {j['preempted']}, cancelled {j['cancelled']}",
        *([f"note: the record starts mid-run: {s['completed_unsubmitted']} completed jobs were submitted and "
           f"{s['ends_unstarted']} phases began before its first event (the events stream keeps about "
           "MAKESPAN_EVENTS_MAX_LEN entries); waits, makespan and weighted completion count only the jobs it saw "
           "submitted, the phase and transition counts only what it holds"]
          if s["completed_unsubmitted"] or s["ends_unstarted"] else []),
        f"makespan: {s['makespan_s']:.3f} s   weighted completion: {s['weighted_completion_s']:.3f} s",
        *([f"deadlines: {s['tardy_jobs']} of {s['jobs_with_deadline']} completed jobs with a deadline_s were late; "
           f"weighted tardiness {s['weighted_tardiness_s']:.3f} s"] if s["jobs_with_deadline"] else []),
        f"utilization: {s['utilization']:.1%} (executes cut short by a preemption included; the demo's and replay's summaries count completed jobs' executes only)   busy {s['busy_gpu_s']:.3f} GPU-s, "
        f"transition {s['transition_gpu_s']:.3f} GPU-s, idle {s['idle_gpu_s']:.3f} GPU-s",
        "phases: " + ", ".join(f"{p} {s['phase_count'][p]}x/{s['phase_gpu_s'][p]:.3f} GPU-s" for p in PHASES),
        "transitions: " + ", ".join(f"{t} {n}x" for t, n in s["transition_count"].items())
        + (f" ({s['restore_cold_starts']} of the cold starts are restores or prewarms)" if s["restore_cold_starts"] else "")
        + "   sleeps by level: " + ", ".join(f"{k} {n}x" for k, n in s["sleep_level_count"].items()),
    ]
    if s["completed_by_priority"]:
        lines.append("completed by priority: " + ", ".join(f"{p} {n}" for p, n in s["completed_by_priority"].items()))
    for p, w in s["wait_s"].items():
        lines.append(f"wait {p:<8} p50 {w['p50']:.3f} s  p95 {w['p95']:.3f} s  (n={w['n']})")
    cut = s["cut_short"]
    if cut["preempted"]:
        lines.append(f"phases cut short by a preemption: {cut['preempted']} (planned, not a failure: the planner "
                     "gave their GPUs to more urgent jobs and queued the preempted jobs again)")
    if cut["reclaimed"]:
        lines.append(f"phases cut short by a reclaimed lease: {cut['reclaimed']} (a GPU worker stopped renewing its "
                     "lease: it died, hung or lost Redis; or handed it back for a failed start or a missing function)")
    if cut["handed_back"]:
        lines.append(f"phases cut short by a GPU worker's clean stop: {cut['handed_back']} (SIGTERM: it handed its "
                     "leases back and their jobs were queued again, no attempt counted)")
    if cut["ended"]:
        lines.append(f"phases ended by their job's failure, cancel or retry: {cut['ended']}")
    if cut["open_at_end"]:
        lines.append(f"phases still running when the record ends: {cut['open_at_end']}")
    lines.append(f"drain checks: {s['drains']}")
    return "\n".join(lines)


def endpoint_colours(endpoints: Iterable[str | None]) -> dict[str, str]:
    """endpoint name -> colour: :data:`ENDPOINT_PALETTE` in sorted name order (cycled
    past ten endpoints); a phase with no endpoint is keyed :data:`NO_ENDPOINT`, grey."""
    names = sorted({e for e in endpoints if e})
    out = {n: ENDPOINT_PALETTE[i % len(ENDPOINT_PALETTE)] for i, n in enumerate(names)}
    out[NO_ENDPOINT] = "#bdbdbd"
    return out


def render_gantt(events: list[dict[str, Any]], out_png: str, gpu_order: list[str] | None = None,
                 title: str = "") -> str:
    """Draw one lane per GPU with a bar per phase; return ``out_png``.

    Bars are filled by phase (:data:`PHASE_COLOURS`; a transition phase by what it did
    where its event says, :data:`TRANSITION_COLOURS`: sleep, wake, cold start, in the
    legend when present) over a band along their lower
    third coloured by endpoint (:func:`endpoint_colours`); their edge colour and hatch
    show the job's priority (:data:`PRIORITY_EDGES`, :data:`PRIORITY_HATCH`). Execute
    bars wide enough carry ``endpoint job/priority-initial``, other bars wide enough the
    endpoint. Phases still open are drawn faded. Failures are red crosses and drain
    checks dotted vertical lines. x is wall seconds since the first event. GPUs not in
    ``gpu_order`` are appended in sorted order. Two legends: phase / priority, and
    endpoint (one entry per endpoint of the run).

    A transition phase's bar (evict, start_endpoint, clear, restore) is at least
    :data:`MIN_TRANSITION_FRACTION` of the chart's time span wide (0.8 %: a few seconds'
    wake in a run of many hours is far below one pixel at its real width), any other bar
    at least :data:`MIN_BAR_FRACTION`; so a short transition is drawn wider than it
    lasted (its length is in the summary and ``transition_error``), over the start of
    the bar that follows it (transition bars are drawn last). Every bar starts at its
    real start, except a transition that begins while the widened transition before it
    on the same GPU is still drawn (a sleep, then a wake): it is drawn right after that
    one, so neither hides the other.

    Raises:
        ValidationError: ``events`` is empty (field ``events``).
    """
    fig = gantt_figure(events, gpu_order, title)
    import matplotlib.pyplot as plt

    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return str(out_png)


def _boxes(rows: list[float], widths: list[float], lefts: list[float], top: float,
           bottom: float) -> list[list[tuple[float, float]]]:
    """Rectangles (four corners each) from ``left`` to ``left + width`` and from ``row + top``
    to ``row + bottom``: the bars of one ``PolyCollection`` (one artist for thousands of
    bars: a ``Rectangle`` each took most of a large report's time)."""
    return [[(x, y + top), (x + w, y + top), (x + w, y + bottom), (x, y + bottom)]
            for y, w, x in zip(rows, widths, lefts)]


def gantt_figure(events: list[dict[str, Any]], gpu_order: list[str] | None = None, title: str = "") -> Any:
    """The matplotlib ``Figure`` :func:`render_gantt` saves (its one axes holds both
    legends: ``ax.get_legend()`` is the endpoint legend, the phase / priority legend is
    an extra artist). The caller closes it (``plt.close(fig)``). Bar widths as
    :func:`render_gantt` says (a transition at least :data:`MIN_TRANSITION_FRACTION` of
    the time span).

    Raises:
        ValidationError: ``events`` is empty (field ``events``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    if not events:
        raise ValidationError("events", [], "no events to draw")
    evs = sorted(events, key=lambda e: e["ts"])
    t0 = evs[0]["ts"]
    ivs = intervals(evs)
    seen = sorted({g for iv in ivs for g in iv.gpus} | {g for ev in evs for g in (ev.get("gpus") or [])})
    lanes = list(gpu_order or []) + [g for g in seen if g not in (gpu_order or [])]
    if not lanes:
        lanes = ["(no GPU)"]
    row = {g: i for i, g in enumerate(lanes)}
    span = max(evs[-1]["ts"] - t0, 1e-9)
    ep_colour = endpoint_colours(iv.endpoint for iv in ivs)
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.45 * len(lanes) + 1.4)))
    # transition bars last: widened to their minimum, they are drawn over the bar that follows.
    # Bars are gathered and drawn by (pass, hatch, alpha), a vectorised barh each: one barh per
    # bar took 21 of the 33 s of a 20,000-event report (a large-queue check)
    drawn_end: dict[str, float] = {}  # per GPU: where its last widened transition bar ends
    bars: dict[tuple[bool, str, float], list[tuple[float, float, float, str, str, str]]] = {}
    for iv in sorted(ivs, key=lambda iv: iv.phase in TRANSITION_PHASES):  # ivs are in start order
        p = iv.priority or ""  # no job (a set-point restore): plain black edge
        least = MIN_TRANSITION_FRACTION if iv.phase in TRANSITION_PHASES else MIN_BAR_FRACTION
        width = max(iv.end_s - iv.start_s, span * least)
        alpha = 1.0 if iv.complete else 0.45
        for g in iv.gpus:
            left = iv.start_s
            if iv.phase in TRANSITION_PHASES:  # not hidden under the widened one before it
                left = max(left, drawn_end.get(g, left))
                drawn_end[g] = left + width
            bars.setdefault((iv.phase in TRANSITION_PHASES, PRIORITY_HATCH.get(p, ""), alpha), []).append(
                (row[g], width, left, TRANSITION_COLOURS.get(iv.transition or "", PHASE_COLOURS.get(iv.phase, "#cccccc")),
                 PRIORITY_EDGES.get(p, "#000000"), ep_colour[iv.endpoint or NO_ENDPOINT]))
            if (iv.end_s - iv.start_s) > span * 0.06:
                text = iv.endpoint or ""
                if iv.phase == "execute" and iv.job:
                    text = f"{iv.endpoint or '?'} {iv.job[-8:]}/{(p or '?')[0]}"
                if text:
                    ax.text(iv.start_s + (iv.end_s - iv.start_s) / 2, row[g] - 0.08, text,
                            ha="center", va="center", fontsize=7, clip_on=True,
                            bbox={"facecolor": "white", "alpha": 0.7, "pad": 1, "linewidth": 0})
    for (_transition, hatch, alpha), group in sorted(bars.items(), key=lambda kv: kv[0][0]):  # transitions last
        rows, widths, lefts, fills, edges, bands = (list(column) for column in zip(*group))
        ax.add_collection(PolyCollection(_boxes(rows, widths, lefts, -0.35, 0.35), facecolors=fills,
                                         edgecolors=edges, linewidths=1.2, hatch=hatch or None, alpha=alpha))
        ax.add_collection(PolyCollection(_boxes(rows, widths, lefts, 0.35 - 0.24, 0.35), facecolors=bands,
                                         linewidths=0, alpha=alpha))  # endpoint band, lower third
    failed = [(ev["ts"] - t0, row[g]) for ev in evs if ev["kind"] == "failed" for g in ev.get("gpus") or [] if g in row]
    if failed:
        ax.plot([x for x, _ in failed], [y for _, y in failed], linestyle="none", marker="x", color="red",
                markersize=8)
    for ev in evs:
        if ev["kind"] == "drain":
            ax.axvline(ev["ts"] - t0, color="#666666", linestyle=":", linewidth=0.8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # lane 0 on top (collections do not autoscale the axes)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("wall seconds since first event")
    ax.set_title(title or "makespan: phases per GPU")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    phase_handles = [Patch(facecolor=PHASE_COLOURS[p], edgecolor="#000000", label=p) for p in PHASES]
    phase_handles += [Patch(facecolor=TRANSITION_COLOURS[t], edgecolor="#000000", label=t.replace("_", " "))
                      for t in TRANSITIONS if any(iv.transition == t for iv in ivs)]
    prio_handles = [Patch(facecolor="white", edgecolor=PRIORITY_EDGES[p], hatch=PRIORITY_HATCH[p], linewidth=1.2,
                          label=p) for p in PRIORITY_EDGES]
    phase_legend = ax.legend(handles=phase_handles + prio_handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                             fontsize=8, title="phase / priority", title_fontsize=8)
    ax.add_artist(phase_legend)
    used = sorted({iv.endpoint for iv in ivs if iv.endpoint}) + ([NO_ENDPOINT] if any(
        not iv.endpoint for iv in ivs) else [])
    ep_handles = [Patch(facecolor=ep_colour[e], edgecolor="none", label=e) for e in used]
    ax.legend(handles=ep_handles, loc="upper left", bbox_to_anchor=(1.16, 1.0), fontsize=8, title="endpoint",
              title_fontsize=8)
    fig.tight_layout()
    return fig
