"""``makespan hosts``, ``makespan cordon HOST`` and ``makespan uncordon HOST``: the fleet's
hosts as the planner sees them (GPU worker live or down, GPUs leased, cordoned), and taking
a host out of service and back (:mod:`makespan.workers.host_liveness`, "Cordoned hosts";
docs/operations.md "Taking a host out of service")."""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path
from typing import Any

import redis
import typer

from makespan.cli_support import context, fail, published_fleet, store_error, utc_text
from makespan.errors import MakespanError, ValidationError

FLEET_HELP = "TOML fleet file (default: the fleet the planner published)"


def host_rows(r: Any, keys: Any, fleet: Any) -> list[dict[str, Any]]:
    """One row per host of ``fleet`` (fleet order): ``host``, ``pool`` (None without pools),
    ``gpus``, ``leased`` (GPUs a lease holds), ``jobs`` (ids of the jobs holding them),
    ``worker`` (``live``; ``down``: a worker ran there and none consumes now; ``never``: none
    has run there yet, the planner does not gate it until a lease there expires unconsumed;
    ``never (unconsumed)``: such a lease expired, the host is down), ``cordoned`` (bool), ``state``
    (``schedulable``, ``down``, ``cordoned``: leases still running there, ``drained``:
    cordoned with no lease left, its worker may be stopped), ``reason`` (its cordon's; for a
    ``never (unconsumed)`` host, why it is down), ``since`` (unix s)
    and ``since_utc`` of its cordon ('' and None when not cordoned), ``by``;
    ``planner_leads`` (a planner of its pool holds the leader lock; without one nothing
    new is scheduled there, and ``reason`` says so). Then a row per host the fleet file no
    longer has that still holds leases or runs a live GPU worker (``state`` ``not in
    fleet``, ``gpus`` None: the fleet file no longer says how many it has).

    Raises:
        redis.RedisError: Redis failed."""
    from makespan.workers import host_liveness

    hosts = [host.name for host in fleet.hosts]
    uuids = {host.name: [gpu.uuid for gpu in host.gpus] for host in fleet.hosts}
    pipe = r.pipeline(transaction=False)
    host_liveness.queue_reads(pipe, keys, hosts)
    pipe.mget([keys.gpu(gpu) for host in hosts for gpu in uuids[host]])  # a fleet host has a GPU at least
    pool_names = [pool.name for pool in fleet.pools] if fleet.pools else [None]
    for pool_name in pool_names:
        pipe.exists(keys.for_pool(pool_name).planner_leader)
    seen, live, cordoned_raw, holders, *leading = pipe.execute()
    leads = dict(zip(pool_names, (bool(x) for x in leading)))
    hosts_now = host_liveness.availability(hosts, seen, live, cordoned_raw)
    lease_ids = sorted({holder.split(":")[0] for holder in holders if holder})
    job_of: dict[str, str] = {}
    if lease_ids:
        pipe = r.pipeline(transaction=False)
        for lease_id in lease_ids:
            pipe.hget(keys.lease(lease_id), "job")
        job_of = {lease_id: job or "" for lease_id, job in zip(lease_ids, pipe.execute())}
    pool_of = {host: pool.name for pool in fleet.pools for host in pool.hosts} if fleet.pools else {}
    from makespan.workers.worker_fleets import endpoints_of, read_worker_fleets

    fleets = read_worker_fleets(r, keys, fleet)  # the GPU workers that run another fleet file than the planner's
    rows, at = [], 0
    for host in hosts:
        held = [holder for holder in holders[at:at + len(uuids[host])] if holder]
        at += len(uuids[host])
        cordon = hosts_now.cordoned.get(host)
        worker = "down" if host in hosts_now.down else "live" if host in seen else "never"
        unconsumed = worker == "down" and str(seen.get(host, "")).startswith(host_liveness.UNCONSUMED)
        if unconsumed:
            worker = "never (unconsumed)"
        if cordon is not None:
            state = "cordoned" if held else "drained"
        else:
            state = "down" if host in hosts_now.down else "schedulable"
        jobs = sorted({job_of.get(holder.split(":")[0], "") for holder in held} - {""})
        planner_leads = leads.get(pool_of.get(host), False)
        reason = cordon.reason if cordon else ("no GPU worker ever consumed its queue: a lease there expired "
                                               "unconsumed" if unconsumed else "")
        if host in fleets.other_gpus:  # the GPU-swap gate: nothing is leased here (makespan.workers.worker_fleets)
            gated = (f"its GPU worker's fleet file (version {fleets.versions.get(host, '?')}) lacks GPUs the "
                     "planner's gives this host: nothing is leased here until it restarts with the planner's file")
            reason = f"{reason}; {gated}" if reason else gated
        elif host in fleets.differing and fleets.differing[host] != endpoints_of(fleet):
            differs = (f"its GPU worker runs another fleet file (version {fleets.versions.get(host, '?')}): jobs of "
                       "endpoints it lacks, or has at another tensor_parallel, are not leased here")
            reason = f"{reason}; {differs}" if reason else differs
        if not planner_leads:  # said on every host it applies to, beside a cordon's or down host's reason
            leaderless = (f"no planner of pool {pool_of[host]} leads: nothing new is scheduled here until one does"
                          if pool_of.get(host) else "no planner leads: nothing new is scheduled until one does")
            reason = f"{reason}; {leaderless}" if reason else leaderless
        rows.append({"host": host, "pool": pool_of.get(host), "gpus": len(uuids[host]), "leased": len(held),
                     "jobs": jobs, "worker": worker, "cordoned": cordon is not None, "state": state,
                     "reason": reason, "since": cordon.since_s if cordon else None,
                     "since_utc": utc_text(cordon.since_s) if cordon else None, "by": cordon.by if cordon else "",
                     "planner_leads": planner_leads})
    return rows + _hosts_outside(r, keys, set(hosts), seen, leads)


def _hosts_outside(r: Any, keys: Any, fleet_hosts: set[str], seen: dict[str, str],
                   leads: dict[str | None, bool]) -> list[dict[str, Any]]:
    """Rows (``state`` ``not in fleet``) for the hosts the fleet file no longer has that
    still hold leases or run a live GPU worker: their jobs run to their end there, and an
    operator waits for 0 leased before stopping the worker (the host vanished from the
    listing while its jobs ran: an SRE's report). Sorted by name.

    Raises:
        redis.RedisError: Redis failed."""
    lease_ids = sorted(r.zrange(keys.leases, 0, -1))
    pipe = r.pipeline(transaction=False)
    for lease_id in lease_ids:
        pipe.hmget(keys.lease(lease_id), "holder", "job", "gpus")
    held: dict[str, list[tuple[str, list[str]]]] = {}
    for holder, job, gpus in pipe.execute() if lease_ids else []:
        if holder and holder not in fleet_hosts:
            try:
                gpu_list = json.loads(gpus) if gpus else []
            except ValueError:
                gpu_list = []
            held.setdefault(holder, []).append((job or "", gpu_list))
    others = sorted(set(held) | {host for host in seen if host not in fleet_hosts})
    live = dict(zip(others, r.mget([keys.host_live(host) for host in others]))) if others else {}
    rows = []
    for host in others:
        if host not in held and not live.get(host):
            continue  # gone and idle: nothing to wait for
        leases = held.get(host, [])
        rows.append({"host": host, "pool": None, "gpus": None,  # its GPUs are in no fleet file the planner reads
                     "leased": len({g for _job, gpus in leases for g in gpus}),
                     "jobs": sorted({job for job, _gpus in leases} - {""}),
                     "worker": "live" if live.get(host) else "down", "cordoned": False, "state": "not in fleet",
                     "reason": ("not in the fleet file: no new lease; its leases run to their end, then stop its "
                                "GPU worker" if leases else "not in the planner's fleet file: its GPU worker gets no "
                                "job; adding the host? restart the planner with the worker's file; removing it? stop "
                                "the worker"),
                     "since": None, "since_utc": None, "by": "", "planner_leads": any(leads.values())})
    return rows


def _fleet(r: Any, keys: Any, fleet_path: Path | None) -> Any:
    from makespan.models import load_fleet

    return load_fleet(fleet_path) if fleet_path is not None else published_fleet(r, keys)


def _known_host(fleet: Any, host: str) -> None:
    names = [h.name for h in fleet.hosts]
    if host not in names:
        raise ValidationError("host", host, f"not a host of the fleet (hosts: {', '.join(names)})")


def hosts(fleet: Path | None = typer.Option(None, "--fleet", help=FLEET_HELP),
          as_json: bool = typer.Option(False, "--json", help="one JSON object per host and line"),
          instances: bool = typer.Option(False, "--instances", help="also list each host's endpoint instances: "
                                         "endpoint, GPUs, running / asleep (at which sleep level) / waking / "
                                         "stopping")) -> None:
    """The fleet's hosts: GPUs, how many are leased (and by which jobs), whether a GPU worker
    consumes the host's queue, and whether an operator cordoned it. STATE: schedulable; down
    (its GPU worker stopped: no new lease until one is back); cordoned (no new lease, leases
    still running); drained (cordoned and no lease left: its GPU worker may be stopped)."""
    try:
        _, r, keys = context()
        spec = _fleet(r, keys, fleet)
        rows = host_rows(r, keys, spec)
        if instances:
            on_host = _instances_by_host(r, keys, spec)
            for row in rows:
                row["instances"] = on_host.get(row["host"], [])
        stray = sorted(set(r.hkeys(keys.hosts_cordoned)) - {row["host"] for row in rows})
    except MakespanError as e:
        fail(e)
    except redis.RedisError as e:
        fail(store_error("reading the hosts", e))
    if stray:  # a cordon outlives its host's removal from the fleet: it applies again if the host comes back
        typer.echo(f"note: cordoned hosts the fleet does not have: {', '.join(stray)} (they stay cordoned if they "
                   f"come back; `makespan uncordon {stray[0]}` lifts one)", err=True)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, sort_keys=True))
        return
    pooled = any(row["pool"] for row in rows)
    width = max([4, *(len(row["host"]) for row in rows)])
    worker_width = max([6, *(len(row["worker"]) for row in rows)])  # "never (unconsumed)" is 18
    typer.echo(f"{'HOST':<{width}} " + ("POOL         " if pooled else "") + f"GPUS LEASED {'WORKER':<{worker_width}} "
               "STATE        SINCE                 REASON")
    for row in rows:
        pool = f"{(row['pool'] or '-'):<12} " if pooled else ""
        since = row["since_utc"] or "-"
        reason = row["reason"] or ("" if not row["cordoned"] else "(none given)")
        if row["jobs"]:
            leased_by = f"leased by {', '.join(row['jobs'][:3])}" + (" ..." if len(row["jobs"]) > 3 else "")
            reason = f"{reason}; {leased_by}" if reason else leased_by
        reason = reason or "-"
        gpus = "-" if row["gpus"] is None else row["gpus"]
        typer.echo(f"{row['host']:<{width}} {pool}{gpus:>4} {row['leased']:>6} {row['worker']:<{worker_width}} "
                   f"{row['state']:<12} {since:<21} {reason}")
        for inst in row.get("instances", []):
            level = f" (sleep level {inst['sleep_level']})" if inst["sleep_level"] else ""
            typer.echo(f"  {inst['endpoint']:<16} {inst['state']}{level} on {','.join(inst['gpus'])} "
                       f"[{inst['driver']}, instance {inst['id'][:8]}]")
        if instances and not row.get("instances"):
            typer.echo("  (no endpoint instance)")


def _instances_by_host(r: Any, keys: Any, spec: Any) -> dict[str, list[dict[str, Any]]]:
    """Host -> its registered endpoint instances (the instance registry,
    :func:`makespan.workers.drivers.registry.list_instances`): ``{id, endpoint, gpus, state,
    sleep_level, driver}``; ``sleep_level`` only for an asleep or waking one. An instance
    whose host field is empty is placed by its first GPU."""
    from makespan.workers.drivers.registry import list_instances

    by_gpu = {gpu.uuid: host.name for host in spec.hosts for gpu in host.gpus}
    out: dict[str, list[dict[str, Any]]] = {}
    for inst, state in list_instances(r, keys, with_state=True):
        host = inst.host or next((by_gpu[g] for g in inst.gpus if g in by_gpu), "")
        out.setdefault(host, []).append({"id": inst.id, "endpoint": inst.endpoint, "gpus": list(inst.gpus),
                                         "state": state, "sleep_level": inst.sleep_level, "driver": inst.driver})
    return out


def cordon(host: str = typer.Argument(..., help="a host of the fleet"),
           reason: str = typer.Option("", "--reason", help="why, shown by `makespan hosts` and `makespan why`"),
           fleet: Path | None = typer.Option(None, "--fleet", help=FLEET_HELP)) -> None:
    """Take HOST out of service: from now on no new lease (job, restore,
    prewarm, preemption) takes its GPUs; the leases it holds run to their end. Jobs that can
    run only there wait with reason host_cordoned. Once `makespan hosts` shows it drained,
    its GPU worker can be stopped without a host_down incident. `makespan uncordon HOST`
    gives it back."""
    from makespan.workers import host_liveness

    try:
        _, r, keys = context()
        spec = _fleet(r, keys, fleet)
        _known_host(spec, host)
        now, before = host_liveness.cordon(r, keys, host, reason, f"{getpass.getuser()}@{socket.gethostname()}")
        (row,) = [row for row in host_rows(r, keys, spec) if row["host"] == host]
    except MakespanError as e:
        fail(e)
    except redis.RedisError as e:
        fail(store_error(f"cordoning host {host}", e))
    if before is not None:
        kept = " (kept: no --reason given)" if not reason and before.reason else ""
        typer.echo(f"host {host} was already cordoned (since {utc_text(before.since_s)}); reason now: "
                   f"{now.reason or '(none given)'}{kept}")
    else:
        typer.echo(f"cordoned host {host}: no new lease on its {row['gpus']} GPUs from now on")
    if row["leased"]:
        shown = ", ".join(row["jobs"][:3]) + (f" and {len(row['jobs']) - 3} more: `makespan hosts --json`"
                                              if len(row["jobs"]) > 3 else "")
        typer.echo(f"{row['leased']} of its {row['gpus']} GPUs {'is' if row['leased'] == 1 else 'are'} still leased (jobs {shown}); "
                   f"it is drained when `makespan hosts` shows 0 leased")
    else:
        typer.echo(f"drained: no lease left; its GPU worker may be stopped (`makespan uncordon {host}` gives it back)")


def uncordon(host: str = typer.Argument(..., help="a host of the fleet"),
             fleet: Path | None = typer.Option(None, "--fleet", help=FLEET_HELP)) -> None:
    """Give HOST back to the planner after `makespan cordon`: its GPUs take new leases from
    the planner's next tick (once a GPU worker consumes its queue). A host the fleet no
    longer has can be uncordoned too (its cordon would apply again if it came back)."""
    from makespan.workers import host_liveness

    try:
        _, r, keys = context()
        if not r.hexists(keys.hosts_cordoned, host):  # a cordoned host is always known: only check the others
            _known_host(_fleet(r, keys, fleet), host)
        removed = host_liveness.uncordon(r, keys, host)
        # a worker hint only for a host of the fleet (one the fleet dropped takes no lease anyway)
        known = r.get(keys.fleet)
        in_fleet = bool(known) and any(h.get("name") == host for h in json.loads(known).get("hosts", []))
        worker_live = bool(r.exists(keys.host_live(host))) or not in_fleet
    except MakespanError as e:
        fail(e)
    except redis.RedisError as e:
        fail(store_error(f"uncordoning host {host}", e))
    if removed is None:
        typer.echo(f"host {host} was not cordoned: nothing changed")
    else:
        why = f" ({removed.reason})" if removed.reason else ""
        typer.echo(f"uncordoned host {host}: cordoned since {utc_text(removed.since_s)}{why}; it takes new leases "
                   "from the planner's next tick" + ("" if worker_live else f" once a GPU worker runs there (none does "
                                                     f"now: start `makespan gpu-worker --fleet FLEET --host {host} --workloads MODULES`)"))


def fleet_summary(spec: Any) -> dict[str, Any]:
    """What :func:`check_fleet` prints of a fleet: ``name``, ``fleet_version``, ``hosts``,
    ``gpus``, ``endpoints`` (name -> tensor-parallel size), ``set_point_gpus`` (GPUs with a
    set point), ``pools`` (names; [] without pools)."""
    from makespan.models import fleet_version
    from makespan.workers.worker_fleets import endpoints_of

    return {"name": spec.name, "fleet_version": fleet_version(spec), "hosts": len(spec.hosts),
            "gpus": sum(len(host.gpus) for host in spec.hosts), "endpoints": endpoints_of(spec),
            "set_point_gpus": sum(len(group.gpus) for e in spec.endpoints.values() for group in e.set_point),
            "pools": [pool.name for pool in spec.pools]}


_GPU_FIELDS = {"gpus", "gpu_count", "memory_mib"}  # a host's fields that say which GPUs it has


def fleet_difference(published: Any, mine: Any) -> list[str]:
    """Lines naming how fleet ``mine`` differs from ``published`` (both FleetSpecs): hosts
    added, removed, with another GPU count, other GPU UUIDs (a GPU swap) or other GPU memory;
    endpoints added, removed, or with another ``tensor_parallel`` or ``memory_mib_per_gpu``
    (what cancels queued jobs or moves work, docs/operations.md "Changing the fleet file"),
    ``launch`` (what runs on the GPUs), set point or any other field, each named; pools
    added, removed, with other hosts, and the pools serving each endpoint; the fleet's name;
    and any other fleet-wide field: "other fleet-wide settings". Every difference found is
    listed, not only the first kind."""
    lines = []
    old_hosts = {host.name: host for host in published.hosts}
    new_hosts = {host.name: host for host in mine.hosts}
    for what, old, new in (("hosts", old_hosts, new_hosts), ("endpoints", dict(published.endpoints),
                                                                 dict(mine.endpoints))):
        if added := sorted(set(new) - set(old)):
            lines.append(f"{what} added: {', '.join(added)}")
        if removed := sorted(set(old) - set(new)):
            lines.append(f"{what} removed: {', '.join(removed)}")
    common = sorted(set(new_hosts) & set(old_hosts))
    if changed := [h for h in common if len(new_hosts[h].gpus) != len(old_hosts[h].gpus)]:
        lines.append("GPUs changed: " + ", ".join(f"{h} {len(old_hosts[h].gpus)} -> {len(new_hosts[h].gpus)}"
                                                  for h in changed))
    uuids = {h: ({g.uuid for g in old_hosts[h].gpus}, {g.uuid for g in new_hosts[h].gpus}) for h in common}
    swapped = [h for h in common if uuids[h][1] - uuids[h][0]]  # GPUs an old GPU worker's file lacks
    if swapped:
        lines.append("GPU UUIDs changed (cordon the host until its GPU worker runs this file): " + ", ".join(
            f"{h} ({len(uuids[h][1] - uuids[h][0])} new, {len(uuids[h][0] - uuids[h][1])} gone)" for h in swapped))
    memory_of = {h: ({g.uuid: g.memory_mib for g in old_hosts[h].gpus}, {g.uuid: g.memory_mib for g in new_hosts[h].gpus})
                 for h in common}
    memory = [h for h in common if any(memory_of[h][0][u] != memory_of[h][1][u] for u in uuids[h][0] & uuids[h][1])]
    if memory:
        shown = lambda host: "/".join(sorted({str(g.memory_mib) for g in host.gpus}))  # noqa: E731
        lines.append("GPU memory_mib changed: " + ", ".join(f"{h} {shown(old_hosts[h])} -> {shown(new_hosts[h])}"
                                                            for h in memory))
    reordered = [h for h in common if uuids[h][0] == uuids[h][1]
                 and [(g.uuid, g.index) for g in old_hosts[h].gpus] != [(g.uuid, g.index) for g in new_hosts[h].gpus]]
    if reordered:
        lines.append(f"GPUs listed in another order or with other CUDA indices (same UUIDs): {', '.join(reordered)}")
    # a host's fields beside its GPUs (gpu_count and memory_mib are a way of writing them)
    rest = {h: (old_hosts[h].model_dump(exclude=_GPU_FIELDS), new_hosts[h].model_dump(exclude=_GPU_FIELDS))
            for h in common}
    rewritten = [h for h in common if h not in swapped and h not in memory and h not in reordered and h not in changed
                 and old_hosts[h] != new_hosts[h] and rest[h][0] == rest[h][1]]
    if rewritten:
        lines.append(f"hosts written another way, the same GPUs (gpu_count as a gpus list, or back): "
                     f"{', '.join(rewritten)}")
    both = sorted(set(mine.endpoints) & set(published.endpoints))
    named = ("tensor_parallel", "memory_mib_per_gpu", "launch", "set_point")
    for field in ("tensor_parallel", "memory_mib_per_gpu"):
        moved = [e for e in both if getattr(mine.endpoints[e], field) != getattr(published.endpoints[e], field)]
        if moved:
            lines.append(f"{field} changed: " + ", ".join(
                f"{e} {getattr(published.endpoints[e], field)} -> {getattr(mine.endpoints[e], field)}" for e in moved))
    if launched := [e for e in both if mine.endpoints[e].launch != published.endpoints[e].launch]:
        lines.append(f"launch changed (what runs on the GPUs): {', '.join(launched)}")
    if moved := [e for e in both if mine.endpoints[e].set_point != published.endpoints[e].set_point]:
        lines.append(f"set point changed: {', '.join(moved)}")
    other_fields = []
    for e in both:
        old_dump = published.endpoints[e].model_dump(exclude=set(named))
        new_dump = mine.endpoints[e].model_dump(exclude=set(named))
        other_fields += [f"{e}.{key}" for key in sorted(set(old_dump) | set(new_dump))
                         if old_dump.get(key) != new_dump.get(key)]
    for h in common:
        old_dump, new_dump = rest[h]
        other_fields += [f"{h}.{key}" for key in sorted(set(old_dump) | set(new_dump))
                         if old_dump.get(key) != new_dump.get(key)]
    if other_fields:
        lines.append(f"other fields changed: {', '.join(other_fields)}")
    lines += _pool_changes(published, mine)
    if published.name != mine.name:
        lines.append(f"fleet name changed: {published.name!r} -> {mine.name!r}")
    fleet_wide = {"hosts", "endpoints", "pools", "name"}
    if published.model_dump(exclude=fleet_wide) != mine.model_dump(exclude=fleet_wide):
        lines.append("other fleet-wide settings changed")
    if not lines and published != mine:
        lines.append("other settings changed")
    return lines


def _pool_changes(published: Any, mine: Any) -> list[str]:
    """Lines naming each pool added or removed, each pool's hosts moved, and each endpoint
    served by other pools (queued jobs of an endpoint its pool stops serving move to a pool
    that serves it, docs/scaling.md "Pools"); [] when the pools are the same."""
    if published.pools == mine.pools:
        return []
    old_pools = {pool.name: pool for pool in published.pools}
    new_pools = {pool.name: pool for pool in mine.pools}
    lines = []
    if added := sorted(set(new_pools) - set(old_pools)):
        lines.append(f"pools added: {', '.join(added)}")
    if removed := sorted(set(old_pools) - set(new_pools)):
        where = "a pool that serves their endpoint" if mine.pools else "the whole fleet's one planner (no pools)"
        lines.append(f"pools removed: {', '.join(removed)} (their queued jobs move to {where})")
    for name in sorted(set(old_pools) & set(new_pools)):
        before, after = set(old_pools[name].hosts), set(new_pools[name].hosts)
        if before != after:
            gained, lost = sorted(after - before), sorted(before - after)
            lines.append(f"pool {name} hosts: " + "; ".join(
                part for part in (f"+{', '.join(gained)}" if gained else "", f"-{', '.join(lost)}" if lost else "")
                if part))
    def serving(fleet: Any, endpoint: str) -> str:
        names = fleet.pools_serving(endpoint)
        return ",".join(sorted(names)) if fleet.pools else "the whole fleet (no pools)"

    stopped, gained = [], []
    for endpoint in sorted(set(published.endpoints) & set(mine.endpoints)):
        was, now = set(published.pools_serving(endpoint)), set(mine.pools_serving(endpoint))
        if published.pools and mine.pools and was == now:
            continue
        if not mine.pools or (published.pools and was - now):
            stopped.append(f"{endpoint} {serving(published, endpoint)} -> {serving(mine, endpoint)}")
        elif was != now or not published.pools:
            gained.append(f"{endpoint} {serving(published, endpoint)} -> {serving(mine, endpoint)}")
    if stopped:
        lines.append("pools stop serving an endpoint (its queued jobs there move to a pool, or the whole fleet, that "
                     f"serves it): {'; '.join(stopped)}")
    if gained:
        lines.append(f"more pools serve an endpoint: {'; '.join(gained)}")
    order = [pool.name for pool in published.pools if pool.name in new_pools]
    if not lines and order != [pool.name for pool in mine.pools if pool.name in old_pools]:
        lines.append("pool order changed (a job two pools could start equally soon goes to the first)")
    if not lines:
        lines.append("pools changed (their endpoint lists, with the same effect)")
    return lines


WAITING_COUNT_MAX = 10_000  # jobs counted per removed endpoint at most ("10000+")


def _waiting_on_removed(settings: Any, r: redis.Redis, keys: Any, running: Any, mine: Any) -> list[str]:
    """A line counting the queued and delayed jobs of the endpoints ``mine`` removes from
    ``running``: the planner cancels them when it runs ``mine`` ("cannot run on the fleet
    the planner runs now"), so the check says how many before the change, not after."""
    from makespan.cli_why import scan_jobs

    counts = []
    for endpoint in sorted(set(running.endpoints) - set(mine.endpoints)):
        try:
            found, _cut = scan_jobs(r, keys, settings, ("queued", "delayed"), endpoint=endpoint,
                                    limit=WAITING_COUNT_MAX)
        except (MakespanError, redis.RedisError):
            continue
        if found:
            counts.append(f"{endpoint} {len(found)}{'+' if len(found) >= WAITING_COUNT_MAX else ''}")
    if not counts:
        return []
    return [f"queued or delayed jobs of removed endpoints, which the planner cancels when it runs this file: "
            f"{', '.join(counts)} (`makespan jobs --endpoint E` lists them; let them finish first, or keep the "
            "endpoint in the file until they have)"]


def check_fleet(fleet: Path = typer.Argument(..., help="the TOML fleet file to check"),
                published: bool = typer.Option(False, "--against-published",
                                               help="also compare it with the fleet the running planner published "
                                                    "(reads MAKESPAN_REDIS_URL)"),
                as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object")) -> None:
    """Check a fleet file with this version of makespan, without starting anything: exit 0
    and a summary (hosts, GPUs, endpoints, set points, pools, fleet_version) when the
    planner, GPU workers and observer of this version would accept it; exit 2 with the first
    problem otherwise. Run it with the new version before an upgrade or a rolling change of
    the fleet file (docs/operations.md, "Upgrades"). With --against-published, the JSON's
    "against_published" is "same", "differs" or "none_published" and "published" says how."""
    from makespan.models import load_fleet

    try:
        spec = load_fleet(fleet)
    except MakespanError as e:
        fail(e)
    summary = fleet_summary(spec)
    summary["warnings"] = spec.sleep_warnings()
    differences: list[str] = []
    if published:
        try:
            settings, r, keys = context()
            raw = r.get(keys.fleet)
        except MakespanError as e:
            fail(e)
        except redis.RedisError as e:
            fail(store_error("reading the published fleet", e))
        running = None
        if not raw:
            differences = ["no planner has published a fleet yet"]
        else:
            from makespan.models import parse_fleet

            try:
                running = parse_fleet(json.loads(raw))
            except (ValueError, MakespanError) as e:  # written by another version: this one refuses it
                differences = [f"the published fleet (the running planner's) does not load with this version: {e}; "
                               "this file replaces it when the planner restarts with it"]
        if running is not None:
            other = fleet_summary(running)
            if other["fleet_version"] != summary["fleet_version"]:
                differences = [f"differs from the published fleet (version {other['fleet_version']})",
                               *fleet_difference(running, spec), *_waiting_on_removed(settings, r, keys, running, spec)]
        summary["published"] = differences or ["the same as the published fleet"]
        # for scripts: same (the published fleet's version), differs, or none published yet
        summary["against_published"] = ("none_published" if not raw else
                                        "differs" if differences else "same")
    if as_json:
        typer.echo(json.dumps(summary, sort_keys=True))
        return
    set_points = f", set points on {summary['set_point_gpus']} GPUs" if summary["set_point_gpus"] else ""
    pools = f", pools {', '.join(summary['pools'])}" if summary["pools"] else ""
    hosts = f"{summary['hosts']} host{'s' if summary['hosts'] != 1 else ''}"
    typer.echo(f"ok: {fleet}: fleet {summary['name']!r}, {hosts}, {summary['gpus']} GPUs, "
               f"{len(summary['endpoints'])} endpoints{set_points}{pools}; fleet_version {summary['fleet_version']}")
    for line in summary.get("published", []):
        typer.echo(f"  {line}")
    for line in summary["warnings"]:
        typer.echo(f"  warning: {line}")


def register(app: typer.Typer) -> None:
    """Add ``hosts``, ``cordon``, ``uncordon`` and ``check-fleet``."""
    app.command("check-fleet")(check_fleet)
    app.command("hosts")(hosts)
    app.command("cordon")(cordon)
    app.command("uncordon")(uncordon)
