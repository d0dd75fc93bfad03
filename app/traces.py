"""Reading job traces and mapping their rows onto a fleet's endpoints and priorities.

Formats:
    * ITP (Microsoft, ElasticFlow release): CSV ``job_id,submission_time,duration,num_gpu``.
    * Alibaba FGD 2023 pod list (``openb_pod_list_*.csv``): ``name, ..., num_gpu,
      creation_time, scheduled_time, deletion_time, qos`` — duration is
      ``deletion_time − scheduled_time``, priority comes from ``qos``.
    * native JSON lines: one job object per line with ``endpoint, priority, service_s,
      submit_s`` (and optionally ``payload``, ``idempotency_key``, ``id``).

The mapping rule (deterministic for a seed; docs/planner.md "Simulator" lists the row checks):
    * tensor parallelism: the largest TP among the fleet's endpoints that is ≤ the
      row's ``num_gpu`` (rows asking for more than any endpoint's TP get the largest;
      rows with 0 GPUs get the smallest);
    * endpoint: among endpoints of that TP, ``sha256(seed:job_id)`` picks one uniformly;
    * priority (ITP has none): bucket ``sha256(seed:prio:job_id) mod 20`` →
      CRITICAL 0–1 (10%), HIGH 2–5 (20%), NORMAL 6–13 (40%), LOW 14–19 (30%);
      Alibaba ``qos``: LS → CRITICAL, Burstable → HIGH, Guaranteed → NORMAL, BE → LOW;
    * submission: seconds after the window's first row; service: the row's duration.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from makespan.errors import ValidationError
from makespan.models import FleetSpec, Priority, read_user_file

def traces_dir() -> Path:
    """Where the shared real traces live: ``MAKESPAN_TRACES_DIR`` if set, else
    ``../shared/data/traces`` beside the repository (the layout CI and sessions use).

    Raises:
        ValidationError: the folder does not exist (the message says how to point at it).
    """
    import os

    env = os.environ.get("MAKESPAN_TRACES_DIR")
    d = Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "traces"
    if not d.is_dir():
        raise ValidationError("MAKESPAN_TRACES_DIR", str(d),
                              "no trace folder there; set MAKESPAN_TRACES_DIR to the data/traces folder")
    return d


ALIBABA_QOS = {"LS": Priority.CRITICAL, "Burstable": Priority.HIGH, "Guaranteed": Priority.NORMAL,
               "BE": Priority.LOW}


@dataclass(frozen=True)
class TraceJob:
    """One trace row mapped onto the fleet. ``submit_s`` is relative to the window start."""

    id: str
    submit_s: float
    service_s: float
    endpoint: str
    priority: Priority
    num_gpu: int

    def job_dict(self) -> dict[str, Any]:
        """Keyword arguments for :func:`makespan.producer.submit`."""
        return {"endpoint": self.endpoint, "priority": self.priority.name, "service_s": self.service_s,
                "idempotency_key": f"trace:{self.id}", "payload": {"trace_job": self.id}}


def _h(seed: int, *parts: str) -> int:
    return int.from_bytes(hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()[:8], "big")


def hash_priority(job_id: str, seed: int) -> Priority:
    b = _h(seed, "prio", job_id) % 20
    if b < 2:
        return Priority.CRITICAL
    if b < 6:
        return Priority.HIGH
    if b < 14:
        return Priority.NORMAL
    return Priority.LOW


def pick_endpoint(fleet: FleetSpec, num_gpu: int, job_id: str, seed: int) -> str:
    tps = sorted({e.tensor_parallel for e in fleet.endpoints.values()})
    fitting = [t for t in tps if t <= max(num_gpu, 1)]
    tp = fitting[-1] if fitting else tps[0]
    names = sorted(n for n, e in fleet.endpoints.items() if e.tensor_parallel == tp)
    return names[_h(seed, "ep", job_id) % len(names)]


def _number(row: dict[str, Any], column: str, where: str, kind: type = float) -> float:
    """``row[column]`` as a finite number (``kind`` int: a whole one, ``"4.0"`` too).

    Raises:
        ValidationError: field ``where.column``: missing, not a number, NaN or infinite."""
    raw = row.get(column)
    if isinstance(raw, bool) or raw is None or raw == "":
        raise ValidationError(f"{where}.{column}", raw, "missing: every row needs a number here")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValidationError(f"{where}.{column}", raw, "not a number") from None
    if not math.isfinite(value):
        raise ValidationError(f"{where}.{column}", raw, "must be a finite number")
    if kind is int:
        if value != int(value):
            raise ValidationError(f"{where}.{column}", raw, "must be a whole number")
        return int(value)
    return value


def _duration(value: float, column: str, where: str, raw: Any) -> float:
    if value < 0:
        raise ValidationError(f"{where}.{column}", raw, "negative duration: a job cannot end before it starts; "
                                                        "fix or delete the row")
    return value


def read_trace(path: str | Path, fleet: FleetSpec, seed: int = 0, start: int = 0,
               limit: int | None = None, max_service_s: float | None = None) -> list[TraceJob]:
    """Read ``limit`` rows from row ``start`` of a trace file and map them (module doc).

    Rows of zero duration (a job that did not run) and Alibaba rows with no GPU or never
    scheduled are skipped; every other row must be whole (as many values as the
    header), with finite numbers and no negative duration or GPU count.

    Raises:
        ValidationError: missing file, a folder, not UTF-8, unknown format, or a row with
            bad values (field ``trace row N.column`` for CSV, the header being row 1;
            ``trace line N`` for JSON lines); the error names the file (``source``).
    """
    p = Path(path)
    if start < 0:
        raise ValidationError("start", start, "must be >= 0 (a row index)")
    if limit is not None and limit < 1:
        raise ValidationError("limit", limit, "must be >= 1 (rows to read; omit it for all)")
    text = read_user_file(p, "trace")
    try:
        if p.suffix.lower() in JSON_LINES_SUFFIXES:
            return _read_jsonl(text, fleet, start, limit)
        return _read_csv(text, fleet, seed, start, limit, max_service_s)
    except ValidationError as e:
        raise e.in_file(p) from None


def _read_csv(text: str, fleet: FleetSpec, seed: int, start: int, limit: int | None,
              max_service_s: float | None) -> list[TraceJob]:
    try:
        header = next(csv.reader(io.StringIO(text, newline="")), [])
    except csv.Error as e:
        raise ValidationError("trace row 1", "<header>", f"not CSV: {e}") from None
    if {"job_id", "submission_time", "duration", "num_gpu"} <= set(header):
        kind = "itp"
    elif {"name", "num_gpu", "creation_time", "scheduled_time", "deletion_time", "qos"} <= set(header):
        kind = "alibaba"
    else:
        raise ValidationError("trace row 1", header[:8], "unknown CSV columns: an ITP trace has job_id, "
                                                         "submission_time, duration, num_gpu; an Alibaba pod list "
                                                         "name, num_gpu, creation_time, scheduled_time, "
                                                         "deletion_time, qos")
    out: list[TraceJob] = []
    t0: float | None = None
    rows = csv.DictReader(io.StringIO(text, newline=""))
    i = -1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as e:  # a NUL byte, an unterminated quote at the end
            raise ValidationError(f"trace row {i + 3}", "<row>", f"not CSV: {e}") from None
        i += 1
        if i < start:
            continue
        if limit is not None and len(out) >= limit:
            break
        where = f"trace row {i + 2}"
        if None in row or None in row.values():  # more or fewer values than the header has columns
            extra: Any = row.get(None) or []  # type: ignore[call-overload]  # csv.DictReader's restkey
            got = sum(v is not None for k, v in row.items() if k is not None) + len(extra)
            raise ValidationError(where, row.get("job_id") or row.get("name"),
                                  f"{got} values, the header has {len(header)} columns (a stray comma or quote?)")
        if kind == "itp":
            jid = row["job_id"]
            sub = _number(row, "submission_time", where)
            dur = _duration(_number(row, "duration", where), "duration", where, row["duration"])
            ng = int(_number(row, "num_gpu", where, int))
            if ng < 0:
                raise ValidationError(f"{where}.num_gpu", row["num_gpu"], "must be >= 0")
            prio = hash_priority(jid, seed)
        else:
            if not row["scheduled_time"] or not row["deletion_time"]:
                continue  # never scheduled, or still running when the trace was taken
            jid, sub = row["name"], _number(row, "creation_time", where)
            dur = _duration(_number(row, "deletion_time", where) - _number(row, "scheduled_time", where),
                            "deletion_time", where, row["deletion_time"])
            ng = int(_number(row, "num_gpu", where))
            prio = ALIBABA_QOS.get(row["qos"], Priority.NORMAL)
            if ng <= 0:
                continue  # a CPU-only pod
        if dur == 0:
            continue
        if max_service_s is not None:
            dur = min(dur, max_service_s)
        t0 = sub if t0 is None else t0
        out.append(TraceJob(jid, sub - t0, dur, pick_endpoint(fleet, ng, jid, seed), prio, ng))
    out.sort(key=lambda j: (j.submit_s, j.id))
    return out


JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")  # read as JSON lines (one object per line); others as CSV
JSON_LINES_FIELDS = ("id", "submit_s", "endpoint", "priority", "service_s", "num_gpu")


def _read_jsonl(text: str, fleet: FleetSpec, start: int, limit: int | None) -> list[TraceJob]:
    """JSON lines: one object per line with :data:`JSON_LINES_FIELDS` (``endpoint`` and
    ``service_s`` required; ``submit_s`` default 0, ``priority`` NORMAL, ``id`` ``row{N}``,
    ``num_gpu`` the endpoint's ``tensor_parallel``, which it must equal when given). An
    unknown field (a typo: ``sumbit_s`` made a job arrive at 0) and an ``id`` given twice (the
    second job was lost) are errors naming the line. The jobs come back sorted by
    ``submit_s`` (then id), as CSV rows are, and a window read from ``start`` > 0 starts at
    its first job (``submit_s`` rebased to it, as CSV rows are)."""
    out = []
    seen: dict[str, int] = {}
    for i, line in enumerate(text.splitlines()):
        if i < start or not line.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        where = f"trace line {i + 1}"
        try:
            d = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ValidationError(where, line[:80], f"not JSON: {e}") from None
        if not isinstance(d, dict):
            raise ValidationError(where, line[:80], "must be a JSON object (endpoint, service_s, submit_s, priority)")
        unknown = sorted(set(d) - set(JSON_LINES_FIELDS))
        if unknown:
            raise ValidationError(f"{where}.{unknown[0]}", d[unknown[0]],
                                  f"unknown field; a trace line has {', '.join(JSON_LINES_FIELDS)}")
        endpoint = d.get("endpoint")
        if endpoint not in fleet.endpoints:
            raise ValidationError(f"{where}.endpoint", endpoint,
                                  f"unknown endpoint; known: {', '.join(sorted(fleet.endpoints))}")
        service_s = _number(d, "service_s", where)
        if service_s <= 0:
            raise ValidationError(f"{where}.service_s", d["service_s"], "must be a positive number of seconds")
        submit_s = _number({"submit_s": 0.0, **d}, "submit_s", where)
        if submit_s < 0:
            raise ValidationError(f"{where}.submit_s", d["submit_s"], "must be >= 0 (seconds after the start)")
        tp = fleet.endpoints[endpoint].tensor_parallel
        num_gpu = int(_number({"num_gpu": tp, **d}, "num_gpu", where, int))
        if num_gpu != tp:  # the job runs on its endpoint's group: another count was ignored silently
            raise ValidationError(f"{where}.num_gpu", d["num_gpu"],
                                  f"endpoint {endpoint!r} runs on tensor_parallel={tp} GPUs (a job's GPU count is "
                                  "its endpoint's: leave num_gpu out, or pick the endpoint of that size)")
        try:
            priority = Priority.parse(d.get("priority", "NORMAL"))
        except ValidationError as e:
            raise ValidationError(f"{where}.priority", e.value, e.reason) from None
        job_id = str(d.get("id", f"row{i}"))
        if job_id in seen:
            raise ValidationError(f"{where}.id", job_id, f"given twice (line {seen[job_id]} too): ids must be unique")
        seen[job_id] = i + 1
        out.append(TraceJob(job_id, submit_s, service_s, endpoint, priority, num_gpu))
    out.sort(key=lambda job: (job.submit_s, job.id))
    if start > 0 and out:  # a window from row `start`: its first job arrives at 0, as a CSV window's does
        first = out[0].submit_s
        out = [replace(job, submit_s=job.submit_s - first) for job in out]
    return out
