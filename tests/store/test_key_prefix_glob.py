"""A key prefix with Redis glob characters matches only its own keys in SCAN patterns
(found by a review: ``MAKESPAN_KEY_PREFIX=team*`` made ``delete_prefix`` and the retention
sweep's pattern match another deployment's keys on a shared Redis, ``teamx:…``, and delete
them). Real Redis."""

from __future__ import annotations

from makespan.keys import Keys
from makespan.live import delete_prefix


def test_a_glob_prefix_never_matches_another_deployments_keys(r, prefix):
    globbed, neighbour = Keys(f"{prefix}*[?]"), Keys(f"{prefix}x[a]")  # unescaped, the first matches the second
    mine = [globbed.job("1"), globbed.phase("L1"), globbed.busy("L1"), globbed.awaited("j")]
    theirs = [neighbour.job("1"), neighbour.phase("L1"), neighbour.busy("L1"), neighbour.awaited("j")]
    try:
        for k in mine + theirs:
            r.set(k, "1")
        assert sorted(r.scan_iter(globbed.phase_pattern)) == [globbed.phase("L1")]
        assert sorted(r.scan_iter(globbed.busy_pattern)) == [globbed.busy("L1")]
        assert sorted(r.scan_iter(globbed.awaited_pattern)) == [globbed.awaited("j")]
        assert delete_prefix(r, globbed) == len(mine)
        assert [r.exists(k) for k in theirs] == [1] * len(theirs)
        assert not any(r.exists(k) for k in mine)
    finally:
        r.delete(*mine, *theirs)
