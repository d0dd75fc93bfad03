"""Index of candidate GPU groups, so a placement scans a bounded number of them.

The group rules of the greedy constructions (:mod:`makespan.planner.rules`, the partition
member's own loops in :mod:`makespan.planner.partition`) scan every aligned group of a
job's size and keep the lexicographic minimum of (cost, transition, candidate order). On
a large fleet most of those groups are interchangeable: the cost a rule gives a group
depends on the group only through

    * ``s = max(ready, free)``, its start (``free``: when its GPUs are all free);
    * its *signature* (:func:`signature`): the endpoints resident on its GPUs, how many
      GPUs of whole instances of each the group would break
      (:meth:`makespan.planner.replay.Replay.whole_lost`), the endpoints asleep on all of
      its GPUs, and (partition's spill groups) the endpoint the group is allocated to;
    * whether a GPU of it belongs to a set-point instance (such groups are always
      scanned: the set-point term depends on the group itself).

Among groups of equal signature every rule's cost is a non-decreasing function of ``s``
(the same float operations on the same inputs, plus ``w·s``), and ties go to the earlier
candidate. So a group is *dominated*, and can be left out without changing the choice,
when an earlier candidate of the same signature starts no later (strictly earlier
``free``, or both free by ``ready``): the indexed candidate list keeps, per signature,
the record lows of ``free`` in candidate order up to the first group free by ``ready``,
plus every set-point group, in candidate order. A rule run on that list picks the group
it picks on the full list (``tests/planner/test_placement_index.py`` checks it on random
fleets and batches). An idle group (nothing resident, nothing asleep, free now) is the
common case on a large fleet: one signature, and only its first group is a candidate.

Cost per query: one comparison per group of a signature that is busy past ``ready`` and
precedes its first free group, plus the rule's own work on the candidates kept. After
each placement :meth:`GroupIndex.touch` re-derives the signatures of the groups sharing a
GPU with the placed group (all groups of the host when an endpoint with TP > 1 is
involved, whose whole-instance counts reach across groups).

:func:`full_scan` switches the index off (every candidate scanned, the code before the
index), for the benchmark's side-by-side runs and the property test.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from makespan.planner.replay import Group, Replay

# a candidate list shorter than this is scanned whole (the index costs more than it saves)
INDEX_MIN_GROUPS = 48

_full_scan = False

Signature = tuple


@contextmanager
def full_scan() -> Iterator[None]:
    """Within the block, :func:`enabled` is False: the constructions scan every candidate
    group (the reference behaviour the index must reproduce)."""
    global _full_scan
    before = _full_scan
    _full_scan = True
    try:
        yield
    finally:
        _full_scan = before


def enabled(n_groups: int) -> bool:
    """Whether a candidate list of ``n_groups`` groups is indexed."""
    return not _full_scan and n_groups >= INDEX_MIN_GROUPS


_IDLE = (frozenset((None,)), (), frozenset())  # nothing resident, nothing asleep


def signature(rep: Replay, group: Group, set_point: frozenset[str] | dict[str, str]) -> Signature | None:
    """What a group rule's cost depends on besides the group's start (module doc), or None
    for a group holding a set-point GPU (never merged with another)."""
    res, asl = rep.resident, rep.asleep
    if len(group) == 1:
        u = group[0]
        if u in set_point:
            return None
        r = res[u]
        a = asl[u]
        if r is None:
            return _IDLE if not a else (frozenset((None,)), (), a)
        return frozenset((r,)), ((r, rep.whole_lost(group, r)),), a
    for u in group:
        if u in set_point:
            return None
    held = frozenset(res[u] for u in group)
    lost = tuple(sorted((e, rep.whole_lost(group, e)) for e in held if e is not None))
    common = frozenset.intersection(*(asl[u] for u in group))
    return held, lost, common


_LAYOUTS: dict[tuple, tuple[dict[str, list[int]], dict[str, list[int]]]] = {}
_LAYOUTS_MAX = 16


def _layout(groups: list[Group], host: dict[str, str]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(GPU -> positions of the groups holding it, host -> positions of its groups) of a
    candidate list; read-only, cached for the last :data:`_LAYOUTS_MAX` lists (the
    members of a portfolio index the same lists)."""
    key = (tuple(groups), tuple(host[g[0]] for g in groups))
    hit = _LAYOUTS.get(key)
    if hit is None:
        at_gpu: dict[str, list[int]] = {}
        at_host: dict[str, list[int]] = {}
        for i, g in enumerate(groups):
            for u in g:
                at_gpu.setdefault(u, []).append(i)
            at_host.setdefault(host[g[0]], []).append(i)
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            del _LAYOUTS[next(iter(_LAYOUTS))]
        hit = _LAYOUTS[key] = (at_gpu, at_host)
    return hit


class GroupIndex:
    """Candidate groups (``groups``, in candidate order) of one replay, bucketed by
    signature; ``tags`` (optional, one per group) join the signature (partition's spill
    groups: the endpoint each is allocated to). Keep it current with :meth:`touch` after
    every placement on the replay."""

    __slots__ = ("rep", "groups", "tags", "set_point", "sig", "buckets", "fixed", "at_gpu", "at_host", "seen_res",
                 "wide_tp")

    def __init__(self, rep: Replay, groups: Sequence[Group], tags: Sequence[str] | None = None):
        self.rep = rep
        self.groups = list(groups)
        self.tags = list(tags) if tags is not None else None
        self.set_point = rep.state.set_point
        self.sig: list[Signature | None] = []
        self.buckets: dict[Signature, list[int]] = {}
        self.fixed: list[int] = []  # positions of set-point groups: always candidates
        self.at_gpu, self.at_host = _layout(self.groups, rep._host)
        res, asl, sp, tags = rep.resident, rep.asleep, self.set_point, self.tags
        sigs = self.sig
        idle: list[int] = []
        for i, g in enumerate(self.groups):
            if tags is None and len(g) == 1:  # the common case inlined: an idle single GPU
                u = g[0]
                if res[u] is None and not asl[u] and u not in sp:
                    sigs.append(_IDLE)
                    idle.append(i)
                    continue
            s = self._signature(i)
            sigs.append(s)
            if s is None:
                self.fixed.append(i)
            else:
                self.buckets.setdefault(s, []).append(i)
        if idle:
            self.buckets.setdefault(_IDLE, [])
            self.buckets[_IDLE] = sorted(self.buckets[_IDLE] + idle)
        self.seen_res = {u: res[u] for u in self.at_gpu}
        eps = rep.endpoints
        self.wide_tp = {e for e, ep in eps.items() if ep.tp > 1}

    def _signature(self, i: int) -> Signature | None:
        s = signature(self.rep, self.groups[i], self.set_point)
        if s is None or self.tags is None:
            return s
        return (self.tags[i],) + s

    def touch(self, gpus: Sequence[str]) -> None:
        """The replay placed work on ``gpus``: re-derive the signatures it may change."""
        at = self.at_gpu
        hit = [u for u in gpus if u in at]
        if not hit:
            return
        res, seen, wide = self.rep.resident, self.seen_res, self.wide_tp
        spread = False
        for u in hit:
            old, new = seen[u], res[u]
            if old in wide or new in wide:
                spread = True
            seen[u] = new
        if spread:
            host = self.rep._host
            todo = {i for h in {host[u] for u in hit} for i in self.at_host[h]}
        else:
            todo = {i for u in hit for i in at[u]}
        for i in todo:
            old_sig = self.sig[i]
            if old_sig is None:
                continue  # a set-point group stays a fixed candidate
            new_sig = self._signature(i)
            if new_sig == old_sig:
                continue
            bucket = self.buckets[old_sig]
            del bucket[bisect.bisect_left(bucket, i)]
            if not bucket:
                del self.buckets[old_sig]
            bisect.insort(self.buckets.setdefault(new_sig, []), i)  # type: ignore[arg-type]
            self.sig[i] = new_sig

    def positions(self, ready_s: float) -> list[int]:
        """Positions (in candidate order) of the groups a rule must look at for a job
        ready at ``ready_s`` (module doc): the rest are dominated."""
        fa = self.rep.free_at
        groups = self.groups
        out = list(self.fixed)
        for bucket in self.buckets.values():
            low = float("inf")
            for i in bucket:
                g = groups[i]
                f = fa[g[0]] if len(g) == 1 else max(map(fa.__getitem__, g))
                if f <= ready_s:
                    out.append(i)
                    break
                if f < low:
                    out.append(i)
                    low = f
        out.sort()
        return out

    def candidates(self, ready_s: float) -> list[Group]:
        """:meth:`positions` as groups."""
        groups = self.groups
        return [groups[i] for i in self.positions(ready_s)]
