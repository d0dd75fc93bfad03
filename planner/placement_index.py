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

Cost per query: a bisection per signature in its staircase (the record lows, kept per
signature and rebuilt when one of its record lows changes, or a group joins the signature
where no earlier record low frees before it: free times only grow, so a group off the
staircase whose free time grows, or that leaves, changes nothing), plus the rule's own
work on the candidates kept. After each placement :meth:`GroupIndex.touch` records the GPUs placed
on; the next query re-derives the signatures of the groups sharing one of them (and of
the host's groups holding an endpoint with TP > 1 when one is involved: whole-instance
counts reach across groups).

:func:`full_scan` switches the index off (every candidate scanned, the code before the
index), for the benchmark's side-by-side runs and the property test.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager

from makespan.planner.model import FleetState
from makespan.planner.replay import Group, Replay

# a candidate list shorter than this is scanned whole: the index costs more than it saves
# below about this size (bench/planner_fleet_scale.py: at 64 GPUs the indexed portfolio
# took 87 ms of CPU against the full scan's 61, at 128 about the same, at 512 a third)
INDEX_MIN_GROUPS = 128

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


def signature(rep: Replay, group: Group, set_point: frozenset[str] | dict[str, str],
              wide: frozenset[str] | set[str] | None = None) -> Signature | None:
    """What a group rule's cost depends on besides the group's start (module doc), or None
    for a group holding a set-point GPU (never merged with another). ``wide``: the
    endpoints with TP > 1 (None: looked up)."""
    res, asl = rep.resident, rep.asleep
    if len(group) == 1:
        u = group[0]
        if u in set_point:
            return None
        r = res[u]
        a = asl[u]
        if r is None:
            return _IDLE if not a else (frozenset((None,)), (), a)
        if wide is None:
            wide = {e for e, ep in rep.endpoints.items() if ep.tp > 1}
        # a TP-1 (or unknown) resident: its one GPU; TP > 1: whole instances broken
        return frozenset((r,)), ((r, rep.whole_lost(group, r) if r in wide else 1),), a
    for u in group:
        if u in set_point:
            return None
    held = frozenset(res[u] for u in group)
    lost = tuple(sorted((e, rep.whole_lost(group, e)) for e in held if e is not None))
    common = frozenset.intersection(*(asl[u] for u in group))
    return held, lost, common


class GroupIndex:
    """Candidate groups (``groups``, in candidate order) of one replay, bucketed by
    signature; ``tags`` (optional, one per group, hashable) join the signature (partition's
    spill groups: the endpoint each is allocated to and its smallest GPU memory). The
    groups must be disjoint (ValueError otherwise), as an aligned group list is. Keep it
    current with :meth:`touch` after every placement on the replay."""

    __slots__ = ("rep", "groups", "tags", "set_point", "sig", "buckets", "stairs", "fixed", "at_gpu", "at_host",
                 "seen_res", "wide_tp", "pending")

    def __init__(self, rep: Replay, groups: Sequence[Group], tags: Sequence[Hashable] | None = None):
        self.rep = rep
        self.groups = list(groups)
        self.tags = list(tags) if tags is not None else None
        self.set_point = rep.state.set_point
        self.sig: list[Signature | None] = []
        self.buckets: dict[Signature, list[int]] = {}  # signature -> its positions, ascending
        # signature -> its staircase (positions, negated free times), absent when stale
        self.stairs: dict[Signature, tuple[list[int], list[float]]] = {}
        self.fixed: list[int] = []  # positions of set-point groups: always candidates
        self.pending: list[str] = []  # GPUs touched since the last query
        groups = self.groups
        self.at_gpu = {u: i for i, g in enumerate(groups) for u in g}  # the groups of a list are disjoint
        self.at_host: dict[str, list[int]] | None = None  # host -> positions, built when first needed
        self.wide_tp = {e for e, ep in rep.endpoints.items() if ep.tp > 1}
        if len(self.at_gpu) != sum(map(len, groups)):
            raise ValueError("the groups of a GroupIndex must be disjoint")
        res, asl, sp = rep.resident, rep.asleep, self.set_point
        n = len(groups)
        # idle groups (nothing resident or asleep, no set-point GPU) at C speed: one signature
        busy = [i for i, g in enumerate(groups) if any(res[u] is not None or asl[u] or u in sp for u in g)]
        idle = list(range(n)) if not busy else sorted(set(range(n)).difference(busy))
        self.sig = [None] * n
        if self.tags is None:
            self.sig = [_IDLE] * n
            if idle:
                self.buckets[_IDLE] = idle
        else:
            for i in idle:
                s = self.sig[i] = (self.tags[i],) + _IDLE
                self.buckets.setdefault(s, []).append(i)
        for i in busy:
            s = self.sig[i] = self._signature(i)
            if s is None:
                self.fixed.append(i)
            else:
                bisect.insort(self.buckets.setdefault(s, []), i)
        self.seen_res = {u: res[u] for u in self.at_gpu}

    def clone(self, rep: Replay, touched: Sequence[str] = ()) -> GroupIndex:
        """This index's copy on ``rep``, a replay of the same fleet state that has placed
        work on ``touched`` (GPU uuids) since it started; this index must have been built
        on a fresh replay of that state and never touched or queried since (a template:
        :class:`IndexTemplates`). The copy is the index ``GroupIndex(rep, self.groups,
        self.tags)`` would build (its signatures re-derived for the touched GPUs at its
        first query, as after :meth:`touch`), at the cost of copying the buckets instead
        of deriving every group's signature."""
        out = GroupIndex.__new__(GroupIndex)
        out.rep, out.groups, out.tags, out.set_point = rep, self.groups, self.tags, self.set_point
        out.sig = list(self.sig)
        out.buckets = {s: list(b) for s, b in self.buckets.items()}
        out.stairs = {}
        out.fixed = self.fixed  # read-only once built
        out.pending = list(touched)
        out.at_gpu, out.at_host, out.wide_tp = self.at_gpu, self.at_host, self.wide_tp  # read-only
        out.seen_res = dict(self.seen_res)
        return out

    def _signature(self, i: int) -> Signature | None:
        s = signature(self.rep, self.groups[i], self.set_point, self.wide_tp)
        if s is None or self.tags is None:
            return s
        return (self.tags[i],) + s

    def touch(self, gpus: Sequence[str]) -> None:
        """The replay placed work on ``gpus`` (their free times, residents and sleepers may
        have changed; free times only grow, as placements make them: the staircases
        rely on it). Recorded only; the next :meth:`positions` re-derives what changed
        (touches between two queries coalesce: what matters is the state since the last)."""
        self.pending.extend(gpus)

    def _flush(self) -> None:
        """Re-derive the signatures the pending touches may change and mark the staircases
        of the buckets involved stale."""
        at = self.at_gpu
        hit = list({u: None for u in self.pending if u in at})
        self.pending.clear()
        if not hit:
            return
        res, seen, wide, sigs, stairs = self.rep.resident, self.seen_res, self.wide_tp, self.sig, self.stairs
        spread = False
        for u in hit:
            old, new = seen[u], res[u]
            if old in wide or new in wide:
                spread = True
            seen[u] = new
        moved = {at[u] for u in hit}  # groups whose free time changed (it only grows)
        for i in moved:
            s = sigs[i]
            if s is not None:
                hit_stair = stairs.get(s)
                if hit_stair is not None and _on(hit_stair[0], i):
                    del stairs[s]  # a record low moved; one off the staircase stays dominated
        if spread:  # whole-instance counts reach across the groups of the host
            host = self.rep._host
            if self.at_host is None:
                self.at_host = {}
                for i, g in enumerate(self.groups):
                    self.at_host.setdefault(host[g[0]], []).append(i)
            groups = self.groups
            # a group's whole-instance counts change only where it holds a TP > 1 endpoint
            todo: set[int] = moved | {i for h in {host[u] for u in hit} for i in self.at_host[h]
                                      if any(res[u] in wide for u in groups[i])}
        else:
            todo = moved
        for i in todo:
            old_sig = sigs[i]
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
            sigs[i] = new_sig
            hit_stair = stairs.get(old_sig)
            if hit_stair is not None and _on(hit_stair[0], i):
                del stairs[old_sig]  # leaving: only a record low changes the staircase
            hit_stair = stairs.get(new_sig)  # type: ignore[arg-type]
            if hit_stair is not None and not self._dominated(hit_stair, i):
                del stairs[new_sig]  # type: ignore[arg-type]

    def _dominated(self, stair: tuple[list[int], list[float]], i: int) -> bool:
        """Whether group ``i``, joining the bucket of ``stair``, leaves it as it is: a
        record low before it frees no later (that also covers a group past where the
        staircase stops, at a group free at the planning time)."""
        pos, neg = stair
        k = bisect.bisect_left(pos, i)
        if k == 0:
            return False
        g = self.groups[i]
        fa = self.rep.free_at
        f = fa[g[0]] if len(g) == 1 else max(map(fa.__getitem__, g))
        return -neg[k - 1] <= f

    def _staircase(self, sig: Signature) -> tuple[list[int], list[float]]:
        """The record lows of free time over the bucket in position order (each free
        strictly before every earlier member), as (positions, negated free times, both
        ascending); stops at a group free at the planning time (nothing frees earlier)."""
        fa, groups, floor = self.rep.free_at, self.groups, self.rep.state.now_s
        pos: list[int] = []
        neg: list[float] = []
        low = float("inf")
        for i in self.buckets[sig]:
            g = groups[i]
            f = fa[g[0]] if len(g) == 1 else max(map(fa.__getitem__, g))
            if f < low:
                pos.append(i)
                neg.append(-f)
                low = f
                if f <= floor:
                    break
        hit = self.stairs[sig] = (pos, neg)
        return hit

    def positions(self, ready_s: float) -> list[int]:
        """Positions (in candidate order) of the groups a rule must look at for a job
        ready at ``ready_s`` (module doc): per signature, the record lows of free time
        up to the first group free by ``ready_s``; the rest are dominated."""
        if self.pending:
            self._flush()
        out = list(self.fixed)
        stairs = self.stairs
        key = -ready_s
        for sig in self.buckets:
            hit = stairs.get(sig)
            pos, neg = hit if hit is not None else self._staircase(sig)
            k = bisect.bisect_left(neg, key)  # pos[:k] are free after ready_s, pos[k] by it
            out.extend(pos[:k + 1])
        out.sort()
        return out

    def candidates(self, ready_s: float) -> list[Group]:
        """:meth:`positions` as groups."""
        groups = self.groups
        return [groups[i] for i in self.positions(ready_s)]


def _on(pos: list[int], i: int) -> bool:
    """Whether position ``i`` is in the ascending list ``pos``."""
    k = bisect.bisect_left(pos, i)
    return k < len(pos) and pos[k] == i


class IndexTemplates:
    """Fresh :class:`GroupIndex` es of one fleet state, built once and cloned
    (:meth:`GroupIndex.clone`) for every construction that plans on a replay of that state:
    the portfolio's members all start from the same state, and deriving the signatures
    of every group of a large fleet for each member cost more than the rest of their
    index work (bench/planner_fleet_scale.py). Also the fresh :class:`Replay` of the state
    (:meth:`replay`) and the pruning heap of its free times (:meth:`heap`), the other
    per-member work that grows with the fleet. Holds one entry per ``key``; valid only
    while the state is neither replaced nor edited (one planning call)."""

    __slots__ = ("state", "built", "_fresh", "_heap")

    def __init__(self, state: FleetState):
        self.state = state
        self.built: dict[Hashable, GroupIndex] = {}
        self._fresh: Replay | None = None  # never placed on
        self._heap: list[tuple[float, str]] | None = None

    def _pristine(self) -> Replay:
        if self._fresh is None:
            self._fresh = Replay(self.state)
        return self._fresh

    def replay(self) -> Replay:
        """A fresh replay of the state (:meth:`Replay.copy` of one never placed on: the
        replay ``Replay(state)`` builds, its read-only group caches shared)."""
        return self._pristine().copy()

    def heap(self) -> list[tuple[float, str]]:
        """The fresh replay's free times as :class:`makespan.planner.list_schedule.Prune`
        heapifies them (read-only: Prune copies it)."""
        if self._heap is None:
            self._heap = [(f, u) for u, f in self._pristine().free_at.items()]
            heapq.heapify(self._heap)
        return self._heap

    def index(self, key: Hashable, rep: Replay, groups: Sequence[Group], tags: Sequence[Hashable] | None = None,
              touched: Sequence[str] = ()) -> GroupIndex:
        """The index of ``groups`` (``tags``) on ``rep``, a replay of this state that has
        placed work on ``touched`` since it started (``GroupIndex(rep, groups, tags)``
        then :meth:`GroupIndex.touch`); ``key`` names the list (the same key, the same
        groups and tags: ValueError otherwise)."""
        if rep.state is not self.state:
            raise ValueError("IndexTemplates: a replay of another state")
        template = self.built.get(key)
        if template is None:
            template = self.built[key] = GroupIndex(self._pristine(), groups, tags)
            host = template.rep._host
            template.at_host = {}
            for i, g in enumerate(template.groups):
                template.at_host.setdefault(host[g[0]], []).append(i)
        elif template.groups != list(groups) or template.tags != (list(tags) if tags is not None else None):
            raise ValueError(f"IndexTemplates: key {key!r} names another group list")
        return template.clone(rep, touched)
