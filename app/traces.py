"""Reading job traces and mapping their rows onto a fleet's endpoints and priorities.

Formats:
    * ITP (Microsoft, ElasticFlow release): CSV ``job_id,submission_time,duration,num_gpu``.
    * Alibaba FGD 2023 pod list (``openb_pod_list_*.csv``): ``name, ..., num_gpu,
      creation_time, scheduled_time, deletion_time, qos`` — duration is
      ``deletion_time − scheduled_time``, priority comes from ``qos``.
    * native JSON lines: one job object per line with ``endpoint, priority, service_s,
      submit_s`` (and optionally ``payload``, ``idempotency_key``, ``id``).

The mapping rule (documented in docs/traces.md, deterministic for a seed):
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
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from makespan.errors import ValidationError
from makespan.models import FleetSpec, Priority

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


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="") as f:
        yield from csv.DictReader(f)


def read_trace(path: str | Path, fleet: FleetSpec, seed: int = 0, start: int = 0,
               limit: int | None = None, max_service_s: float | None = None) -> list[TraceJob]:
    """Read ``limit`` rows from row ``start`` of a trace file and map them (module doc).

    Raises:
        ValidationError: missing file, unknown format, or a row with bad values.
    """
    p = Path(path)
    if not p.exists():
        raise ValidationError("trace", str(p), "no such file")
    if not p.is_file():
        raise ValidationError("trace", str(p), "not a file (give one trace file, e.g. a cluster CSV)")
    if start < 0:
        raise ValidationError("start", start, "must be >= 0 (a row index)")
    if limit is not None and limit < 1:
        raise ValidationError("limit", limit, "must be >= 1 (rows to read; omit it for all)")
    if p.suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(p, start, limit)
    with p.open(newline="") as f:
        header = next(csv.reader(f), [])
    if {"job_id", "submission_time", "duration", "num_gpu"} <= set(header):
        kind = "itp"
    elif {"name", "num_gpu", "creation_time", "scheduled_time", "deletion_time", "qos"} <= set(header):
        kind = "alibaba"
    else:
        raise ValidationError("trace", str(p), f"unknown CSV columns {header[:8]}")
    out: list[TraceJob] = []
    t0: float | None = None
    rows = _rows(p)
    for i, row in enumerate(rows):
        if i < start:
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            if kind == "itp":
                jid, sub, dur, ng = row["job_id"], float(row["submission_time"]), float(row["duration"]), int(row["num_gpu"])
                prio = hash_priority(jid, seed)
            else:
                if not row["scheduled_time"] or not row["deletion_time"]:
                    continue
                jid, sub = row["name"], float(row["creation_time"])
                dur = float(row["deletion_time"]) - float(row["scheduled_time"])
                ng = int(float(row["num_gpu"]))
                prio = ALIBABA_QOS.get(row["qos"], Priority.NORMAL)
                if ng <= 0 or dur <= 0:
                    continue
        except (KeyError, ValueError) as e:
            raise ValidationError(f"trace row {i + 2}", row, f"bad value: {e}") from e
        if dur <= 0:
            continue
        if max_service_s is not None:
            dur = min(dur, max_service_s)
        t0 = sub if t0 is None else t0
        out.append(TraceJob(jid, sub - t0, dur, pick_endpoint(fleet, ng, jid, seed), prio, ng))
    out.sort(key=lambda j: (j.submit_s, j.id))
    return out


def _read_jsonl(p: Path, start: int, limit: int | None) -> list[TraceJob]:
    out = []
    for i, line in enumerate(p.read_text().splitlines()):
        if i < start or not line.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            d = json.loads(line)
            out.append(TraceJob(str(d.get("id", f"row{i}")), float(d.get("submit_s", 0.0)), float(d["service_s"]),
                                d["endpoint"], Priority.parse(d.get("priority", "NORMAL")), int(d.get("num_gpu", 1))))
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
            raise ValidationError(f"trace line {i + 1}", line[:80], f"bad job: {e}") from e
    return out
