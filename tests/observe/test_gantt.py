"""Gantt chart and summary from recorded events; ``makespan report`` on a run directory."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from makespan.cli_observe import register
from makespan.errors import ValidationError
from makespan.gantt import PHASE_COLOURS, intervals, load_events, render_gantt, summarize, summary_stats


def test_intervals_pair_starts_with_ends(events):
    ivs = intervals(events)
    j1 = {iv.phase: iv for iv in ivs if iv.job == "j1"}
    assert set(j1) == {"evict", "start_endpoint", "execute", "clear", "restore"}
    assert (j1["execute"].start_s, j1["execute"].end_s) == (4.0, 10.0)
    assert j1["restore"].gpus == ("GPU-host-a-0", "GPU-host-a-1")
    assert all(iv.complete for iv in ivs)


def test_open_phase_runs_to_last_event_and_is_counted(events):
    # j2's lease has no final event that ends it (j1's restore_end, on j1's lease in this
    # fixture, now ends j1's phases still open: a restore whose evict failed)
    cut = [e for e in events if not (e["kind"] == "phase_end" and e.get("job") == "j2" and e["phase"] == "execute")]
    ivs = intervals(cut)
    ex = [iv for iv in ivs if iv.job == "j2" and iv.phase == "execute"][0]
    assert not ex.complete and ex.end_s == 13.5
    assert summary_stats(cut)["incomplete"] == 1


def test_phases_cut_short_are_told_apart_by_why(t0):
    """A clean run with planned preemptions is not reported as broken (found by a new-user
    trial: a demo with 0 failed printed ``phases cut short (preempted or reclaimed lease) or
    still open at the end: 26``; all 26 were preempted leases' phases)."""
    def phase(lease, kind, ts, **extra):
        return {"ts": t0 + ts, "kind": kind, "lease": lease, "job": f"j-{lease}", "phase": "execute",
                "gpus": ["GPU-0"], "priority": "LOW", **extra}
    evs = [phase("p1", "phase_start", 0), {"ts": t0 + 1, "kind": "preempted", "lease": "p1", "job": "j-p1"},
           phase("p2", "phase_start", 1), {"ts": t0 + 2, "kind": "preempted", "lease": "p2", "job": "j-p2"},
           phase("r1", "phase_start", 2), {"ts": t0 + 3, "kind": "reclaimed", "lease": "r1", "job": "j-r1"},
           phase("o1", "phase_start", 3), phase("o1", "phase_end", 4),
           phase("o2", "phase_start", 4), {"ts": t0 + 5, "kind": "submitted", "job": "late"}]
    s = summary_stats(evs)
    assert s["incomplete"] == 4
    assert s["cut_short"] == {"preempted": 2, "reclaimed": 1, "handed_back": 0, "ended": 0, "open_at_end": 1}
    assert [iv.cut_by for iv in intervals(evs)] == ["preempted", "preempted", "reclaimed", None, "open_at_end"]
    text = summarize(evs)
    assert "phases cut short by a preemption: 2 (planned, not a failure" in text
    assert "phases cut short by a reclaimed lease: 1" in text
    assert "phases still running when the record ends: 1" in text
    assert "or still open at the end" not in text
    only_preempted = summarize(evs[:4])
    assert "preemption: 2" in only_preempted and "reclaimed" not in only_preempted
    assert "still running" not in only_preempted


def test_summary_matches_the_known_workload(events, gpus):
    s = summary_stats(events, gpus)
    assert s["jobs"]["submitted"] == 3 and s["jobs"]["completed"] == 2 and s["jobs"]["failed"] == 1
    assert s["makespan_s"] == pytest.approx(13.0)               # completion of j1 - submission of j1
    assert s["weighted_completion_s"] == pytest.approx(4 * 13 + 1 * 4.5)
    assert s["wait_s"]["HIGH"]["p50"] == pytest.approx(1.0)
    assert s["wait_s"]["LOW"]["p50"] == pytest.approx(1.5)
    assert s["wait_s"]["CRITICAL"]["p50"] == pytest.approx(2.5)
    assert list(s["wait_s"]) == ["CRITICAL", "HIGH", "LOW"]
    assert s["busy_gpu_s"] == pytest.approx(6 * 2 + 3 + 0.5)
    assert s["transition_gpu_s"] == pytest.approx((1 + 2 + 1 + 2) * 2)
    assert s["utilization"] == pytest.approx(15.5 / (3 * 13.0))
    assert s["idle_gpu_s"] == pytest.approx(3 * 13.0 - 15.5 - 12)
    assert s["completed_unsubmitted"] == 0 and "starts mid-run" not in summarize(events, gpus)


def test_a_record_that_starts_mid_run_says_so(events, gpus):
    """A large-queue user's report, from a capped events stream, printed "submitted 100,
    completed 10116" and waits over the few it saw, with no word that the record began mid-run."""
    first_job = next(e["job"] for e in events if e["kind"] == "submitted")
    cut = [e for e in events if not (e["kind"] == "submitted" and e["job"] == first_job)]
    assert summary_stats(cut, gpus)["completed_unsubmitted"] == 1
    assert "note: the record starts mid-run: 1 completed jobs were submitted and 0 phases began before its first " \
           "event" in summarize(cut, gpus)
    # a cut that keeps every submission but loses phases' starts (a verifier: the first 20 lines of a demo's
    # record, its set-point restores, changed the transition counts without a word)
    first_start = next(i for i, e in enumerate(events) if e["kind"] == "phase_start")
    no_start = events[:first_start] + events[first_start + 1:]
    assert summary_stats(no_start, gpus)["ends_unstarted"] == 1
    assert "and 1 phases began before its first event" in summarize(no_start, gpus)
    assert summary_stats(events, gpus)["ends_unstarted"] == 0
    text = summarize(events, gpus)
    assert "makespan: 13.000 s" in text and "wait HIGH" in text and "failed 1" in text


def test_percentiles_interpolate(t0):
    evs = []
    for i, w in enumerate([1.0, 2.0, 3.0, 4.0, 5.0]):
        evs += [{"ts": t0, "kind": "submitted", "job": f"j{i}", "priority": "NORMAL"},
                {"ts": t0 + w, "kind": "leased", "job": f"j{i}", "priority": "NORMAL"}]
    w = summary_stats(evs)["wait_s"]["NORMAL"]
    assert w["p50"] == pytest.approx(3.0) and w["p95"] == pytest.approx(4.8) and w["n"] == 5


def _has_colour(img: np.ndarray, hex_colour: str) -> bool:
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return bool((np.abs(img[..., :3] - rgb).max(axis=-1) < 0.02).sum() > 50)


def test_render_draws_every_phase_colour(tmp_path, events, gpus):
    png = render_gantt(events, str(tmp_path / "g.png"), gpu_order=gpus, title="known")
    img = mpimg.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100
    for phase, colour in PHASE_COLOURS.items():
        assert _has_colour(img, colour), phase


def test_render_without_execute_lacks_its_colour(tmp_path, events):
    no_exec = [e for e in events if e.get("phase") != "execute"]
    img = mpimg.imread(render_gantt(no_exec, str(tmp_path / "g.png")))
    # the legend swatch alone is small; bars are what would pass the >50 pixel threshold
    big = np.abs(img[..., :3] - np.array([0x4d, 0xaf, 0x4a]) / 255).max(axis=-1) < 0.02
    assert big.sum() < 400


def test_render_rejects_empty(tmp_path):
    with pytest.raises(ValidationError):
        render_gantt([], str(tmp_path / "x.png"))


def test_load_events_names_bad_line(tmp_path):
    p = tmp_path / "events.jsonl"
    p.write_text('{"ts": 1, "kind": "submitted"}\n\nnot json\n')
    with pytest.raises(ValidationError) as e:
        load_events(p)
    assert e.value.field == "events.jsonl:3"


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """makespan (test root)."""

    register(app)
    return app


def test_report_command_writes_png_and_prints_summary(tmp_path, events):
    run = tmp_path / "run1"
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    res = CliRunner().invoke(_cli(), ["report", str(run)])
    assert res.exit_code == 0, res.output
    assert (run / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "makespan: 13.000 s" in res.output
    res = CliRunner().invoke(_cli(), ["report", str(run), "--json"])
    assert json.loads(res.output)["jobs"]["completed"] == 2


def test_report_command_missing_events(tmp_path):
    res = CliRunner().invoke(_cli(), ["report", str(tmp_path)])
    assert res.exit_code == 2


def test_gantt_has_a_legend_by_endpoint_with_the_bar_colours(events, gpus):
    """The known run's three endpoints each have a legend entry, in the colour of the
    endpoint band drawn under their bars; execute bars are labelled with the endpoint."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from makespan.gantt import endpoint_colours, gantt_figure

    fig = gantt_figure(events, gpus, "known")
    try:
        ax = fig.axes[0]
        legend = ax.get_legend()
        assert legend.get_title().get_text() == "endpoint"
        entries = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
        colours = endpoint_colours(["judge", "embed", "chat"])
        assert entries == {e: colours[e] for e in ("chat", "embed", "judge")}
        assert len(set(entries.values())) == 3
        # the bars are PolyCollections (one per priority hatch and pass: a Rectangle each was slow)
        bar_colours = {to_hex(c) for coll in ax.collections for c in coll.get_facecolor()}
        assert set(entries.values()) <= bar_colours
        labels = {t.get_text() for t in ax.texts}
        assert {"judge j1/H", "embed j2/L"} <= labels, labels
        phase_legend = next(a for a in ax.artists if a is not legend)
        assert {t.get_text() for t in phase_legend.get_texts()} >= set(PHASE_COLOURS)
    finally:
        plt.close(fig)


def _long_run_with_short_wake() -> list[dict]:
    """One job on one GPU: an 8 s wake, then 57,000 s of execute (NORMAL: no hatch)."""
    base = {"job": "j-long", "lease": "l-long", "gpus": ["GPU-a-0"], "endpoint": "chat", "priority": "NORMAL"}
    return [{"ts": 0.0, "kind": "submitted", **base},
            {"ts": 0.0, "kind": "leased", **base},
            {"ts": 0.0, "kind": "phase_start", "phase": "start_endpoint", **base},
            {"ts": 8.0, "kind": "phase_end", "phase": "start_endpoint", "transition": "wake", **base},
            {"ts": 8.0, "kind": "phase_start", "phase": "execute", **base},
            {"ts": 57_000.0, "kind": "phase_end", "phase": "execute", **base},
            {"ts": 57_000.0, "kind": "completed", **base}]


def _plot_area_pixels(tmp_path, events: list[dict], hex_colour: str) -> int:
    """Pixels of ``hex_colour`` inside the axes of the PNG :func:`render_gantt` writes
    (the legends are outside them)."""
    from makespan.gantt import gantt_figure

    fig = gantt_figure(events)
    box = fig.axes[0].get_position()  # figure fraction: the plot area
    fig.clf()
    img = mpimg.imread(render_gantt(events, str(tmp_path / "g.png")))
    height, width = img.shape[:2]
    plot = img[int((1 - box.y1) * height):int((1 - box.y0) * height), int(box.x0 * width):int(box.x1 * width)]
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(plot[..., :3] - rgb).max(axis=-1) < 0.02).sum())


def test_a_short_wake_in_a_long_run_shows_in_the_plot_area(tmp_path):
    from makespan.gantt import TRANSITION_COLOURS

    assert _plot_area_pixels(tmp_path, _long_run_with_short_wake(), TRANSITION_COLOURS["wake"]) >= 10


def test_a_short_sleep_right_before_a_wake_is_not_hidden_under_it(tmp_path):
    from makespan.gantt import TRANSITION_COLOURS

    events = _long_run_with_short_wake()
    base = {k: events[0][k] for k in ("job", "lease", "gpus", "endpoint", "priority")}
    events[2] = {**events[2], "ts": 2.0}  # the wake: 2 s … 8 s, right after a 2 s sleep
    events += [{"ts": 0.0, "kind": "phase_start", "phase": "evict", **base},
               {"ts": 2.0, "kind": "phase_end", "phase": "evict", "transition": "sleep", **base}]
    for name in ("sleep", "wake"):
        assert _plot_area_pixels(tmp_path, events, TRANSITION_COLOURS[name]) >= 10, name


def test_legend_colours_of_sleep_wake_cold_start_evict_restore_are_distinct(tmp_path):
    from makespan.gantt import TRANSITION_COLOURS, gantt_figure

    named = [PHASE_COLOURS["evict"], PHASE_COLOURS["restore"], PHASE_COLOURS["start_endpoint"],
             *TRANSITION_COLOURS.values()]
    assert len({c.lower() for c in named}) == len(named)
    events = _long_run_with_short_wake()
    events[3] = {**events[3], "transition": "cold_start"}
    j2 = {"job": "j2", "lease": "l2", "gpus": ["GPU-a-1"], "endpoint": "chat", "priority": "NORMAL"}
    events += [{"ts": 1.0, "kind": "phase_start", "phase": "evict", **j2},
               {"ts": 2.0, "kind": "phase_end", "phase": "evict", "transition": "sleep", **j2},
               {"ts": 2.0, "kind": "phase_start", "phase": "start_endpoint", **j2},
               {"ts": 9.0, "kind": "phase_end", "phase": "start_endpoint", "transition": "wake", **j2}]
    fig = gantt_figure(events)
    phase_legend = [a for a in fig.axes[0].artists if hasattr(a, "get_patches")][0]
    colours = [tuple(p.get_facecolor()) for p in phase_legend.get_patches() if p.get_facecolor()[:3] != (1, 1, 1)]
    labels = [t.get_text() for t in phase_legend.get_texts()]
    assert {"sleep", "wake", "cold start", "start_endpoint", "evict", "restore"} <= set(labels)
    assert len(set(colours)) == len(colours), dict(zip(labels, colours))


def test_a_phase_whose_lease_ended_without_its_end_is_not_still_running(t0):
    """`makespan report` of a demo that drained cleanly (leases 0, busy slots 0) said
    "phases still running when the record ends: 1" (found by a new-user check). A phase in
    which its job failed, was cancelled or scheduled a retry has no phase_end (the lease's
    final event ends it); and a phase_start stamped a moment after a preemption that a
    second process stamped earlier but wrote later had nothing after it to end it."""
    def phase(lease, kind, ts, **extra):
        return {"ts": t0 + ts, "kind": kind, "lease": lease, "job": f"j-{lease}", "phase": "execute",
                "gpus": ["GPU-0"], "priority": "LOW", **extra}
    evs = [phase("f1", "phase_start", 0), phase("f1", "failed", 1, reason="execute: boom"),
           phase("c1", "phase_start", 1), phase("c1", "cancelled", 2),
           phase("r1", "phase_start", 2), phase("r1", "retry_scheduled", 3),
           {"ts": t0 + 3.001, "kind": "preempted", "lease": "p1", "job": "j-p1"}, phase("p1", "phase_start", 3.002),
           {"ts": t0 + 4, "kind": "restore_start", "lease": "s1", "job": "restore:e:GPU-1", "gpus": ["GPU-1"]},
           {**phase("s1", "phase_start", 4), "phase": "evict", "job": "restore:e:GPU-1", "gpus": ["GPU-1"]},
           {"ts": t0 + 5, "kind": "restore_end", "lease": "s1", "job": "restore:e:GPU-1", "gpus": ["GPU-1"],
            "outcome": "failed", "reason": "evict: no"},
           {"ts": t0 + 6, "kind": "submitted", "job": "late"}]
    s = summary_stats(evs)
    assert s["cut_short"] == {"preempted": 1, "reclaimed": 0, "handed_back": 0, "ended": 4, "open_at_end": 0}
    by_lease = {(iv.job, iv.phase): iv for iv in intervals(evs)}
    assert by_lease[("j-f1", "execute")].end_s == pytest.approx(1.0)
    assert by_lease[("j-p1", "execute")].end_s == pytest.approx(3.002)
    assert by_lease[("restore:e:GPU-1", "restore")].complete  # restore_end ends the restore itself
    text = summarize(evs)
    assert "still running" not in text
    assert "phases ended by their job's failure, cancel or retry: 4" in text


def test_report_from_redis_writes_a_run_directory_of_a_live_deployment(tmp_path, events, r, keys, redis_url,
                                                                       monkeypatch):
    """`makespan report` read only a demo's or a replay's run directory: a deployment's own
    events needed Python (events.read_all with decode_responses; a sleep-level operator).
    --from-redis writes events.jsonl and fleet.json from the deployment first."""
    from makespan.models import load_fleet
    from tests.conftest import FLEET_TOML

    monkeypatch.setenv("MAKESPAN_REDIS_URL", redis_url)
    monkeypatch.setenv("MAKESPAN_KEY_PREFIX", keys.prefix)
    run = tmp_path / "live"
    res = CliRunner().invoke(_cli(), ["report", str(run), "--from-redis"])
    assert res.exit_code == 2 and "is empty" in res.output, res.output
    for e in events:
        r.xadd(keys.events, {"e": json.dumps(e)})
    r.set(keys.fleet, load_fleet(FLEET_TOML).model_dump_json())
    res = CliRunner().invoke(_cli(), ["report", str(run), "--from-redis", "--json"])
    assert res.exit_code == 0, res.output
    assert f"wrote {len(events)} events" in res.stderr
    assert json.loads(res.stdout)["jobs"]["completed"] == 2
    assert (run / "events.jsonl").read_text().count("\n") == len(events) and (run / "fleet.json").exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    res = CliRunner().invoke(_cli(), ["report", str(a_file), "--from-redis"])
    assert res.exit_code == 2 and "cannot write the run directory" in res.stderr, res.output  # not a traceback


def test_a_clean_worker_stop_is_not_reported_as_a_crash(t0):
    """A new user's report after a SIGTERM of a GPU worker said its phases were cut short by
    a reclaimed lease, "it died, hung or lost Redis"; the events said worker_shutdown."""
    def phase(lease, kind, ts):
        return {"ts": t0 + ts, "kind": kind, "lease": lease, "job": f"j-{lease}", "phase": "execute",
                "gpus": ["GPU-0"], "priority": "NORMAL"}
    evs = [phase("s1", "phase_start", 0),
           {"ts": t0 + 1, "kind": "reclaimed", "lease": "s1", "job": "j-s1", "cause": "worker_shutdown"},
           phase("x1", "phase_start", 1),
           {"ts": t0 + 2, "kind": "reclaimed", "lease": "x1", "job": "j-x1", "cause": "lease_expired"}]
    s = summary_stats(evs)
    assert s["cut_short"] == {"preempted": 0, "reclaimed": 1, "handed_back": 1, "ended": 0, "open_at_end": 0}
    text = summarize(evs)
    assert "phases cut short by a GPU worker's clean stop: 1 (SIGTERM" in text
    assert "phases cut short by a reclaimed lease: 1 (" in text
