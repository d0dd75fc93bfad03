"""The ``makespan`` command line (typer). ``makespan --help`` lists the commands."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import typer

from makespan.cli_support import (EXIT_ALREADY_ENDED, EXIT_NOT_FINISHED, CliGroup, dead_here, held_only_by_the_dead_here,
                                  ignored_fleet_option, outcome_unknown, store_error, utc_text)
from makespan.cli_support import fail as _fail
from makespan.errors import MakespanError, RedisAuthFailed, RedisConfigError, SubmitOutcomeUnknown, ValidationError
from makespan.planner.policies import DEFAULT_POLICY, POLICY_REGISTRY

app = typer.Typer(cls=CliGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_show_locals=False,  # a traceback's locals could hold a Redis URL's password
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="makespan: schedule multi-step GPU workloads on a fleet of GPU hosts.")


def _print_version(value: bool) -> None:
    if value:
        from makespan import __version__

        typer.echo(f"makespan {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                               help="print makespan's version and exit")) -> None:
    """makespan: schedule multi-step GPU workloads on a fleet of GPU hosts."""

SIM_PROGRESS_EVERY_S = 5.0  # wall seconds between progress lines of `makespan simulate`
FleetOpt = typer.Option(..., "--fleet", help="TOML fleet file (see examples/render-pipeline.toml)")
# policy help, generated from the registry (makespan.planner.policies): names and one-line descriptions
LIVE_POLICY_HELP = f"planner policy (default: MAKESPAN_POLICY, else {DEFAULT_POLICY}): {POLICY_REGISTRY.help_text()}"
SIMULATE_POLICY = "portfolio"  # `makespan simulate`'s default: milliseconds per planning point
_TIMED = ", ".join(p.name for p in POLICY_REGISTRY.values() if p.time_limit_s is not None)
_SCORED = ", ".join(p.name for p in POLICY_REGISTRY.values() if p.floor is not None)
_RULED = ", ".join(p.name for p in POLICY_REGISTRY.values() if p.floor is None)
SIMULATE_POLICY_HELP = (f"{POLICY_REGISTRY.help_text()} (default here: {SIMULATE_POLICY}; the time-limited policies, "
                        f"{_TIMED}, take about --time-limit-s per planning point)")


def _settings(**kw):
    from makespan.settings import Settings

    return Settings.from_env(**{k: v for k, v in kw.items() if v is not None})




def _log_level(default: str) -> str:
    """:func:`makespan.settings.log_level_from_env`; a bad value fails the command in one
    line (exit 2)."""
    from makespan.settings import log_level_from_env

    try:
        return log_level_from_env(default)
    except ValidationError as e:
        _fail(e)
        raise  # unreachable: _fail exits


def _log_format() -> str:
    """:func:`makespan.log_format.log_format_from_env`; a bad value fails the command in one
    line (exit 2)."""
    from makespan.log_format import log_format_from_env

    try:
        return log_format_from_env()
    except ValidationError as e:
        _fail(e)
        raise  # unreachable: _fail exits


def _logging(level: str = "INFO") -> None:
    """Root logging at ``MAKESPAN_LOG_LEVEL`` (default ``level``) in ``MAKESPAN_LOG_FORMAT``
    (:mod:`makespan.log_format`; httpx at WARNING: not a line per HTTP request)."""
    from makespan.log_format import configure

    configure(_log_level(level), _log_format())


@app.command()
def planner(fleet: Path = FleetOpt, policy: str | None = typer.Option(None, help=LIVE_POLICY_HELP),
            metrics_port: int = typer.Option(0, envvar="MAKESPAN_METRICS_PORT", help="Prometheus port (0: none)"),
            pool: str | None = typer.Option(None, envvar="MAKESPAN_POOL", help="the pool this planner plans, for a "
                                            "fleet file with \\[\\[pools]] (required there; one leader per pool, "
                                            "docs/scaling.md \"Pools\")")):
    """Run a planner worker (one leads, others stand by). Configured by MAKESPAN_* variables, listed in docs/configuration.md: MAKESPAN_POLICY (default: default), MAKESPAN_PREEMPTION (plan or rule), MAKESPAN_IMPROVER_EXECUTOR (process or thread), MAKESPAN_IMPROVER_NICE, MAKESPAN_BATCH_SIZE, ..."""
    from makespan.models import load_fleet
    from makespan.redis_conn import connect
    from makespan.workers.planner_worker import PlannerWorker

    _logging()
    try:
        s = _settings(policy=policy)
        f = load_fleet(fleet)
        w = PlannerWorker(connect(s.redis_url), s, f, pool=pool)
    except MakespanError as e:
        _fail(e)
    for line in f.sleep_warnings():  # settings that do nothing as written (`makespan check-fleet` says them too)
        logging.getLogger("makespan.planner").warning("fleet file %s: %s", fleet, line)
    _start_metrics(metrics_port, "planner", pool)
    _gil_switch_interval()
    from makespan import shutdown

    shutdown.on_sigterm(s.shutdown_grace_s, "planner", w.stop)  # the SIGTERM bound
    shutdown.ignore_sighup("planner")  # a log rotator's HUP killed it
    # Ctrl-C / kill -INT stops it as SIGTERM does, also where the shell that started it in the
    # background set SIGINT to ignored (a script's `makespan planner ... &`): the GPU workers
    # (Celery) and the observer install their own SIGINT handler too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        w.run()
    except KeyboardInterrupt:
        w.stop()
    except (RedisConfigError, RedisAuthFailed) as e:  # an evicting maxmemory-policy, refused credentials: one line, exit 2
        _fail(e)


GIL_SWITCH_INTERVAL_S = 0.001


def _gil_switch_interval() -> None:
    """Hand the GIL on after at most ``MAKESPAN_GIL_SWITCH_INTERVAL_S`` (default 1 ms,
    CPython's default is 5 ms). A job crosses the GPU worker's threads (Celery's consumer,
    then a pool thread, each with its heartbeat) in short steps; with 5 ms slices it waits
    for the GIL at each hand-off, and the planner's tick shares its GIL with the lock
    keeper and the metrics server (docs/scaling.md)."""
    raw = os.environ.get("MAKESPAN_GIL_SWITCH_INTERVAL_S")
    try:
        value = float(raw) if raw else GIL_SWITCH_INTERVAL_S
    except ValueError:
        _fail(MakespanError(f"MAKESPAN_GIL_SWITCH_INTERVAL_S={raw!r}: must be a number of seconds"))
    if not value > 0:
        _fail(MakespanError(f"MAKESPAN_GIL_SWITCH_INTERVAL_S={raw!r}: must be positive"))
    sys.setswitchinterval(value)


def _start_metrics(port: int, role: str, pool: str | None = None) -> None:
    """Serve /metrics; only the planner also exports the Redis-read state gauges (queue
    depths, leases, drain) so that they are not scraped twice; a pool's planner, those of
    its pool (labelled ``pool``)."""
    if not port:
        return
    try:
        from makespan import metrics

        metrics.start_metrics_server(port, redis_state=(role == "planner"), pool=pool)
    except (ImportError, AttributeError) as e:  # pragma: no cover - metrics module optional
        logging.getLogger("makespan").warning("metrics not available: %s", e)
    except MakespanError as e:  # its port taken, its directory not writable: one line, exit 2
        _fail(e)


CELERY_POOLS = ("threads", "prefork", "solo")  # gpu-worker --pool: the Celery pools a GPU worker runs on


@app.command("gpu-worker")
def gpu_worker(fleet: Path = FleetOpt, host: str = typer.Option(..., help="host name in the fleet file"),
               pool: str = typer.Option("threads", help="Celery pool: threads, prefork or solo (not a makespan "
                                                         "pool: the fleet file places the host in its pool)"),
               concurrency: int = typer.Option(0, show_default=False, help="worker slots (default, or 0: the host's GPU count)"),
               metrics_port: int = typer.Option(0, envvar="MAKESPAN_METRICS_PORT", help="Prometheus port (0: none)"),
               workloads_given: list[str] = typer.Option([], "--workloads", envvar="MAKESPAN_WORKLOADS",
                                                         help="comma-separated modules that define "
                                                              "@makespan.workload functions (imported at start, as "
                                                              "celery -A does); repeatable"),
               check_gpus: bool = typer.Option(True, help="refuse to start when NVML shows the fleet file's GPUs "
                                               "missing, at another index or with less memory (hosts with "
                                               "explicit gpus; skipped when NVML finds no GPU)")):
    """Run the Celery GPU worker of one host (consumes queue gpu.HOST)."""
    from makespan.models import load_fleet

    # every --workloads given (a repeated one kept only the last: a user's report)
    workloads = ",".join(part for given in workloads_given for part in given.split(",") if part.strip())
    loglevel = _log_level("WARNING")
    _log_format()  # a bad MAKESPAN_LOG_FORMAT fails here, before Celery starts

    try:
        f = load_fleet(fleet)
    except MakespanError as e:
        _fail(e)
    hosts = {h.name: h for h in f.hosts}
    if host not in hosts:
        _fail(MakespanError(f"--host {host!r}: not in the fleet ({', '.join(hosts)})"))
    if concurrency < 0:
        _fail(ValidationError("concurrency", concurrency, "must be at least 1 (0 or omitted: the host's GPU count)"))
    if pool not in CELERY_POOLS:
        pool_of_host = f.pool_of_host(host) if f.pools else None
        hint = (f"; a GPU worker needs no makespan pool: the fleet file puts host {host} in pool {pool_of_host}"
                if pool in {p.name for p in f.pools} or pool_of_host else "")
        _fail(MakespanError(f"--pool {pool!r}: the Celery pool of the GPU worker, one of {', '.join(CELERY_POOLS)}"
                            f"{hint}"))
    if check_gpus:
        _check_gpus(hosts[host])
    _check_log_dir(f)
    os.environ["MAKESPAN_FLEET"] = str(Path(fleet).resolve())
    os.environ["MAKESPAN_HOST"] = host
    names: list[str] = []
    if workloads:
        os.environ["MAKESPAN_WORKLOADS"] = workloads
        from makespan.registry import load_modules

        try:
            names = load_modules(workloads)  # a module that does not import fails here, in one line
        except MakespanError as e:
            _fail(e)
    _say_what_starts(hosts[host], workloads, names, f)
    _start_metrics(metrics_port, "gpu-worker")
    _gil_switch_interval()
    from makespan.log_format import use_for_celery
    from makespan.workers.tasks import celery

    use_for_celery()  # Celery's handlers get MAKESPAN_LOG_FORMAT as it sets them up
    n = concurrency or len(hosts[host].gpus)
    json_logs = _log_format() == "json"
    if json_logs:  # before Celery starts: a library warning at its start is a JSON line too
        from makespan.log_format import configure

        configure(loglevel, "json")
    code = _celery_worker(celery, [*(["--quiet"] if json_logs else []), "worker", "-Q", f"gpu.{host}", "-n",
                                   f"gpu-{host}@%h", "-P", pool, "-c", str(n), "--loglevel", loglevel, "-E",
                                   "--without-gossip", "--without-mingle"])
    if code:
        raise typer.Exit(code)


def _check_log_dir(fleet) -> None:
    """Refuse to start (one line, exit 2) when an endpoint of ``fleet`` starts processes
    (a driver built on the process driver: ``process``, ``vllm``) and the endpoint log
    directory cannot be used (``MAKESPAN_LOG_DIR``, or the per-user default another user
    owns): every start phase would fail on it, one job after another."""
    from makespan.driver_registry import DRIVERS
    from makespan.workers.drivers.process import ProcessDriver, default_log_dir

    try:
        spawns = any(issubclass(DRIVERS.driver_class(spec.launch.driver), ProcessDriver)
                     for spec in fleet.endpoints.values())
    except MakespanError:
        return  # a driver that cannot be loaded fails in its phase, naming itself
    if not spawns:
        return
    import tempfile

    try:
        log_dir = default_log_dir()
        with tempfile.TemporaryFile(dir=log_dir):  # writable, not only there (MAKESPAN_LOG_DIR=/proc was taken)
            pass
    except OSError as e:
        _fail(MakespanError(f"the endpoint log directory cannot be used: {e} (set MAKESPAN_LOG_DIR to a directory "
                            "this user can write)"))


def _say(text: str, err: bool = True) -> None:
    """A GPU worker's start-up line to stderr, in ``MAKESPAN_LOG_FORMAT`` (a JSON object with
    ``json``: :func:`makespan.log_format.as_line`); a ``warning:`` line at WARNING."""
    from makespan.log_format import as_line

    level = "WARNING" if text.startswith("warning:") else "INFO"
    typer.echo(as_line(text, level, "makespan.gpu_worker"), err=err)


def _say_what_starts(host_spec, modules: str, names: list[str], fleet=None) -> None:
    """One line to stderr before Celery's banner: the host, its GPUs (simulated or checked),
    the workload functions loaded; a warning when another GPU worker already consumes the
    host's queue (``P:host:live:{host}``): both then take its phases, so a function only one
    of them loaded fails on the other with UnknownWorkload; and one when ``fleet`` (this
    worker's file) differs from the fleet the planner published (``P:fleet``), naming the
    endpoints this worker lacks: a job of one would fail here. Redis errors skip the checks."""
    kind = "simulated (gpu_count; no NVML check)" if host_spec.simulated else "from the fleet file"
    refused = _refused_names(names, fleet)
    usable = [name for name in names if name not in refused]
    loaded = f"workload functions: {', '.join(usable) or 'none usable'} (from {modules})" if names else \
        "no workload functions (--workloads MODULE to load some)"
    if refused:
        loaded += "; not published (each names an endpoint the fleet does not have): " + ", ".join(
            f"{name} ({endpoint!r})" for name, endpoint in sorted(refused.items()))
    _say(f"gpu-worker {host_spec.name}: {len(host_spec.gpus)} GPU{'' if len(host_spec.gpus) == 1 else 's'} {kind}; queue gpu.{host_spec.name}; {loaded}",
               err=True)
    _say_slowdown(host_spec.name, fleet)
    from makespan.cli_support import context

    from makespan.models import fleet_version, parse_fleet

    try:
        _s, r, keys = context()
        other, published_version, published = r.mget(keys.host_live(host_spec.name), keys.fleet_version, keys.fleet)
        published_fleet = parse_fleet(json.loads(published)) if published and fleet is not None else None
    except Exception as e:  # a hint only: the worker itself reports an unreachable Redis
        logging.getLogger("makespan.cli").debug("start checks against Redis skipped: %s", e)
        return
    if other and dead_here(other):
        _say(f"note: the last GPU worker of host {host_spec.name!r} ({other}) ran on this machine and is no "
                   f"longer running; its liveness mark runs out within MAKESPAN_WORKER_LIVENESS_TTL_S "
                   f"({_s.worker_liveness_ttl_s:g} s)", err=True)
    elif other:
        _say(f"warning: another GPU worker ({other}) already consumes host {host_spec.name!r}'s queue; both "
                   "will take its phases: give both the same --workloads, or stop the other one", err=True)
    if published_fleet is not None and fleet_version(fleet) != fleet_version(published_fleet):
        # an endpoint it lacks, or gives another tensor_parallel: its jobs are not planned here
        # (makespan.workers.worker_fleets)
        lacks = sorted(name for name, spec in published_fleet.endpoints.items()
                       if name not in fleet.endpoints or fleet.endpoints[name].tensor_parallel != spec.tensor_parallel)
        unknown_host = host_spec.name not in {h.name for h in published_fleet.hosts}
        _say(f"warning: this GPU worker's fleet file (version {fleet_version(fleet)}) differs from the fleet the "
                   f"planner published (version {published_version})"
                   + (f"; the planner's fleet has no host {host_spec.name!r}: no job will be planned here"
                      if unknown_host else "")
                   + (f"; it lacks endpoints {', '.join(lacks)} (or gives them another tensor_parallel), whose jobs "
                      "are not planned here" if lacks else "")
                   + ": start the planner and the GPU workers with the same fleet file", err=True)


def _refused_names(names: list[str], fleet=None) -> dict[str, str]:
    """The loaded workload functions (of ``names``) that name an endpoint ``fleet`` does not
    have -> that endpoint: the GPU worker does not publish them (workers/tasks.py
    ``_check_helpers``). Empty without a fleet."""
    if fleet is None:
        return {}
    from makespan.registry import REGISTRY

    out: dict[str, str] = {}
    for name in names:
        definition = REGISTRY.get(name)
        for endpoint in (definition.endpoint, *definition.helpers) if definition is not None else ():
            if endpoint is not None and endpoint not in fleet.endpoints:
                out.setdefault(name, endpoint)
    return out


def _say_slowdown(host: str, fleet=None) -> None:
    """On stderr: the ``MAKESPAN_SIMULATED_SLOWDOWN`` factor of ``host``, and a warning for
    the names in it that are no host of ``fleet`` (a misspelt one slowed nothing, silently)."""
    try:
        slowdown = _settings().slowdown_by_host()
    except MakespanError:
        return  # the worker itself refuses the setting
    if host in slowdown:
        _say(f"gpu-worker {host}: simulated transitions slowed {slowdown[host]:g}x "
                   "(MAKESPAN_SIMULATED_SLOWDOWN)", err=True)
    unknown = sorted(set(slowdown) - {h.name for h in fleet.hosts}) if fleet is not None else []
    if unknown:
        _say(f"warning: MAKESPAN_SIMULATED_SLOWDOWN names {', '.join(unknown)}, no host of the fleet "
                   f"(hosts: {', '.join(h.name for h in fleet.hosts)}): nothing is slowed there", err=True)


def _celery_worker(app, argv: list[str]) -> int:
    """Run ``celery worker`` for ``app`` as ``app.worker_main`` does, but return the
    worker's exit code: ``worker_main`` and ``app.start`` drop it (click's non-standalone
    ``main`` returns it), so a worker that stopped on an unrecoverable error (Celery
    logs ``Unrecoverable error`` and sets exit code 1) exited 0, and a restart-on-failure
    supervisor left it down."""
    from celery.bin.celery import celery as celery_command

    celery_command.params[0].default = app
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    return code if isinstance(code, int) else 0


def _check_gpus(host_spec) -> None:
    from makespan.workers.discovery import NvmlDiscovery
    from makespan.workers.host_check import check_host

    if host_spec.simulated:
        return  # simulated host: its UUIDs are made up
    d = NvmlDiscovery()
    found = d.discover()
    if not found:
        typer.echo(f"GPU check skipped for host {host_spec.name!r}: {d.last_error or 'NVML reports no GPU'}", err=True)
        return
    problems = check_host(host_spec, found)
    if problems:
        _fail(MakespanError("the fleet file does not match this machine's GPUs:\n  " + "\n  ".join(problems)))


@app.command()
def gpus(host_name: str = typer.Option("", "--host-name", help="name of the fleet-file host entry (default: this "
                                       "machine's hostname)"),
         as_json: bool = typer.Option(False, "--json", help="print JSON instead of a fleet-file entry")):
    """List this machine's GPUs through NVML (CUDA_VISIBLE_DEVICES applied) as a fleet-file host entry."""
    import json
    import socket
    from dataclasses import asdict

    from makespan.workers.discovery import NvmlDiscovery
    from makespan.workers.host_check import host_memory_mib, host_toml

    logging.getLogger("makespan.workers.discovery").setLevel(logging.ERROR)  # the reason is printed below
    d = NvmlDiscovery()
    found = d.discover()
    if as_json:
        typer.echo(json.dumps({"gpus": [asdict(g) for g in found], "error": d.last_error}, indent=2))
    elif found:
        name = host_name or socket.gethostname().split(".")[0]
        typer.echo(host_toml(name, found, host_memory_mib()), nl=False)
    if not found:
        typer.echo(d.last_error or "NVML reports no GPU", err=True)
        raise typer.Exit(1)


def _producer(fleet: Path | None):
    """A Producer; without ``--fleet`` the fleet comes from Redis (the planner publishes it)."""
    from makespan.keys import Keys
    from makespan.cli_support import published_fleet
    from makespan.models import fleet_version, load_fleet
    from makespan.producer import Producer
    from makespan.redis_conn import connect

    s = _settings()
    r = connect(s.redis_url)
    keys = Keys(s.key_prefix)
    spec = load_fleet(fleet) if fleet is not None else published_fleet(r, keys, required=False)
    if fleet is not None:  # nothing read Redis yet: one that never answers is unreachable (exit 69), found
        r.ping()           # before the submit, whose lost reply would leave its outcome unknown (exit 75)
        published = r.get(keys.fleet_version)
        if published and spec is not None and published != fleet_version(spec):
            # as the client refuses a call's (Client.fleet): a job checked against one file and planned
            # on another was accepted, then cancelled as "changed after the job was submitted" (a new user)
            from makespan.errors import ValidationError

            raise ValidationError("fleet", spec.name, f"differs from the fleet the planner published (version "
                                                      f"{published}, given {fleet_version(spec)}): use the planner's "
                                                      "fleet file, or give none (omit --fleet: the job is checked "
                                                      "against the fleet the planner runs)")
    return Producer(r, keys, spec, s)


@app.command()
def submit(workload: str | None = typer.Argument(None, help="a workload function's name (registered by a live "
                                                                 "GPU worker's --workloads); omit for a plain job "
                                                                 "of --service-s on --endpoint"),
           call_args: str = typer.Option("[]", "--args", help="JSON list of the function's positional arguments"),
           call_kwargs: str = typer.Option("{}", "--kwargs", help="JSON object of the function's keyword arguments"),
           fleet: Path | None = typer.Option(None, "--fleet", help="default: the fleet the planner runs"),
           endpoint: str | None = typer.Option(None, help="endpoint name from the fleet file (default: the "
                                                             "workload's own)"),
           service_s: float | None = typer.Option(None, help="estimated service time, seconds (default for a "
                                                                "workload: learned from its runs)"),
           priority: str = typer.Option("NORMAL", help="CRITICAL, HIGH, NORMAL or LOW, or 0–3 (0: CRITICAL, 3: LOW)"),
           payload: str = typer.Option("{}", help="JSON object handed to the execute phase"),
           idempotency_key: str | None = typer.Option(None, help="resubmitting the same key returns the same job"),
           delay_s: float | None = typer.Option(None, help="queue the job only this many seconds after submission (>= 0, at most 30 days; 0: at once); until then it is 'delayed' in Redis, never in a worker"),
           deadline_s: float | None = typer.Option(None, help="due time, workload seconds after submission (> 0, at most 365 days); only the tardiness policies plan by it, reports count it under every policy"),
           depends_on: list[str] = typer.Option(None, "--depends-on", help="id of a job that must complete first "
                                                                            "(repeatable); an unknown id is refused"),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the job id (for ID=$(makespan submit ...))")):
    """Submit one job; prints {"id", "created", "priority"} as JSON (--quiet: the id alone). With a WORKLOAD name
    the job calls that function with --args/--kwargs (see `makespan result ID`). With --delay-s the job waits in
    Redis as 'delayed' and is queued when due (cancel works meanwhile). Exit 75 when Redis took the submit but
    its reply never came: the id is printed all the same (the job may or may not exist: `makespan status ID`)."""
    _quiet_producer_warnings_the_cli_prints()
    if idempotency_key is not None and not idempotency_key.strip():
        # an unset shell variable ($KEY) must not drop the idempotency the caller asked for
        _fail(ValidationError("idempotency_key", idempotency_key, "is empty: give a key, or omit --idempotency-key",
                              show_value=False))
    if workload is not None:
        if payload != "{}":
            _fail(MakespanError("--payload is for a plain job; a workload function takes --args and --kwargs"))
        _submit_call(workload, call_args, call_kwargs, fleet, endpoint, service_s, priority, idempotency_key, delay_s,
                     deadline_s, depends_on or [], quiet)
        return
    if call_args != "[]" or call_kwargs != "{}":
        _fail(MakespanError("--args and --kwargs are a workload function's: name the WORKLOAD (the first argument), "
                            "or give a plain job its input with --payload"))
    try:
        missing = [flag for flag, value in (("--endpoint", endpoint), ("--service-s", service_s)) if value is None]
        if missing:
            raise MakespanError(f"a plain job needs {' and '.join(missing)} (or name a WORKLOAD function)")
        try:
            data = json.loads(payload)
        except (json.JSONDecodeError, RecursionError) as e:
            raise MakespanError(f"--payload: not JSON: {e}") from e
        job = {"endpoint": endpoint, "service_s": service_s, "priority": priority, "payload": data}
        if idempotency_key:
            job["idempotency_key"] = idempotency_key
        if delay_s is not None:
            job["delay_s"] = delay_s
        if deadline_s is not None:
            job["deadline_s"] = deadline_s
        if depends_on:
            job["depends_on"] = depends_on
        from makespan import telemetry

        telemetry.setup_tracing("makespan-cli")  # the job's trace ids (nothing is exported at submit)
        producer = _producer(fleet)
        h = producer.submit(job)
    except SubmitOutcomeUnknown as e:
        outcome_unknown(e, quiet)
    except MakespanError as e:
        _fail(e)
    _warn_ignored(idempotency_key, h.id, h.ignored)
    if h.created:  # a repeated key's job may have run long ago
        _warn_if_it_waits(producer, endpoint, delayed=bool(delay_s))
        if deadline_s is not None:
            _note_deadline_policy(producer)
        _warn_ended_dependencies(producer.r, producer.keys, depends_on or [], delayed=bool(delay_s))
    typer.echo(h.id if quiet else json.dumps({"id": h.id, "created": h.created, "priority": h.priority.name}))


def _note_deadline_policy(producer: Any) -> None:
    """On stderr: the leading planner's policy does not plan by deadlines (only the tardiness
    policies do), so ``--deadline-s`` only counts in reports (a new user expected it to change
    the plan). Best effort: nothing when no planner published its policy or Redis fails."""
    import redis

    try:
        policy = json.loads(producer.r.get(producer.keys.planner_config) or "{}").get("policy")
    except (ValueError, AttributeError, redis.RedisError):
        return
    if policy and not str(policy).startswith("tardiness"):
        typer.echo(f"note: the planner's policy is {policy!r}: deadline_s does not change the plan (the tardiness "
                   "policies plan by it, MAKESPAN_POLICY=tardiness); `makespan report` counts late jobs", err=True)


def _warn_if_it_waits(producer: Any, endpoint: str, delayed: bool = False) -> None:
    """On stderr: no planner leads the pool(s) that serve ``endpoint``, every host that could
    run it is cordoned, or no GPU worker consumes any of them now (never started there, or stopped), so the plain
    job just submitted waits until one starts (``delayed``: it was submitted with a delay, and
    waits delayed first). With pools, only the pools that serve the endpoint and their hosts
    count. Best effort: a Redis error here says nothing (the job is written)."""
    import redis

    from makespan.workers.host_liveness import hosts_that_fit

    fleet, keys = producer.fleet, producer.keys
    spec = fleet.endpoints.get(endpoint) if fleet is not None else None
    if spec is None:
        return
    serving = fleet.pools_serving(endpoint)  # [] without pools: every host
    hosts = {h for pool in serving for h in fleet.pool(pool).hosts} if serving else {h.name for h in fleet.hosts}
    fits = hosts_that_fit(fleet, hosts, spec.tensor_parallel, spec.memory_mib_per_gpu)
    if not fits:
        return
    pools: list[str | None] = list(serving) or [None]
    try:
        live = producer.r.mget([keys.host_live(host) for host in fits])
        leaders = producer.r.mget([keys.for_pool(pool).planner_leader for pool in pools])
        cordoned = producer.r.hmget(keys.hosts_cordoned, fits)
    except redis.RedisError:
        return
    if not any(leaders):
        which = f"pool {', '.join(str(p) for p in pools)}" if serving else "this fleet"
        option = f" --pool {pools[0]}" if serving else ""
        waits = ("stays delayed past its delay (nothing queues it)" if delayed else "waits queued")
        typer.echo(f"warning: no planner leads {which} (which runs endpoint {endpoint!r}): the job {waits}, "
                   f"reason no_planner, until one starts (makespan planner --fleet FILE{option})", err=True)
    if all(cordoned):
        typer.echo(f"warning: every host that can run endpoint {endpoint!r} ({', '.join(fits)}) is cordoned: the job "
                   f"waits queued, reason host_cordoned, until one is uncordoned (makespan hosts; makespan uncordon "
                   f"{fits[0]})", err=True)
    elif not any(live):
        typer.echo(f"warning: no GPU worker runs on {', '.join(fits)} (the hosts that can run endpoint {endpoint!r}): "
                   f"the job waits queued until one starts there (makespan gpu-worker --fleet FLEET --host {fits[0]} --workloads MODULES)",
                   err=True)
    else:
        _warn_if_no_worker_file_runs(producer, endpoint, [host for host, up in zip(fits, live) if up])


def _warn_if_no_worker_file_runs(producer: Any, endpoint: str, live_hosts: list[str]) -> None:
    """On stderr: every live GPU worker of ``live_hosts`` runs a fleet file without
    ``endpoint`` (or with another tensor_parallel): the job waits, reason
    ``host_fleet_differs`` (:mod:`makespan.workers.worker_fleets`). Best effort."""
    import redis

    from makespan.workers.worker_fleets import read_worker_fleets

    try:
        fleets = read_worker_fleets(producer.r, producer.keys, producer.fleet)
    except redis.RedisError:
        return
    lacking = set(fleets.hosts_lacking(producer.fleet, endpoint))
    if live_hosts and lacking.issuperset(live_hosts):
        typer.echo(f"warning: the GPU workers of {fleets.detail(live_hosts, producer.fleet, [endpoint])} run another "
                   "fleet file than the planner's, one that cannot run this job there: the job waits queued, "
                   "reason host_fleet_differs, until one runs the planner's file (docs/operations.md \"Changing the "
                   "fleet file\")", err=True)


def _warn_ended_dependencies(r: Any, keys: Any, depends_on: list[str], delayed: bool = False) -> None:
    """On stderr: :func:`makespan.producer.ended_dependency_warnings` (a dependency that has
    already failed or been cancelled: the job just submitted never runs)."""
    from makespan.producer import ended_dependency_warnings

    for warning in ended_dependency_warnings(r, keys, depends_on, delayed):
        typer.echo(f"warning: {warning}", err=True)


def _warn_ignored(idempotency_key: str | None, job_id: str, ignored: tuple[str, ...]) -> None:
    """On stderr: a repeated idempotency key returned job ``job_id``, and this submit's
    ``ignored`` options differ from it (:class:`makespan.producer.JobHandle`)."""
    if ignored:
        from makespan.producer import ignored_options_text

        typer.echo(f"warning: {ignored_options_text(idempotency_key, job_id, ignored)}", err=True)


def _quiet_producer_warnings_the_cli_prints() -> None:
    """The producer logs a repeated idempotency key's unused options as a warning (for
    programs); the submit commands print it as their own ``warning:`` line instead."""
    import logging

    logger = logging.getLogger("makespan.producer")
    if _quiet_while_a_submit_runs not in logger.filters:  # once per process, and only while a command runs
        logger.addFilter(_quiet_while_a_submit_runs)


def _quiet_while_a_submit_runs(record) -> bool:
    """A ``makespan.producer`` log filter: drop the warning a ``makespan submit`` running
    now prints itself; the same warning of a program's own submit (outside a command) passes."""
    from makespan.cli_support import _RUNNING
    from makespan.producer import CLI_PRINTS_IT

    return not (getattr(record, CLI_PRINTS_IT, False) and _RUNNING.get() is not None)



def _submit_call(workload: str, call_args: str, call_kwargs: str, fleet: Path | None, endpoint: str | None,
                 service_s: float | None, priority: str, idempotency_key: str | None, delay_s: float | None,
                 deadline_s: float | None, depends_on: list[str], quiet: bool) -> None:
    """``makespan submit WORKLOAD``: the same call as ``makespan.connect().submit(...)``."""
    from makespan.client import SUBMIT_OPTIONS, Client

    try:
        try:
            args = json.loads(call_args)
        except (json.JSONDecodeError, RecursionError) as e:
            raise MakespanError(f"--args: not JSON: {e} (got {call_args[:80]!r})") from e
        try:
            kwargs = json.loads(call_kwargs)
        except (json.JSONDecodeError, RecursionError) as e:
            raise MakespanError(f"--kwargs: not JSON: {e} (got {call_kwargs[:80]!r})") from e
        if isinstance(args, dict) and call_kwargs.strip() == "{}":
            raise MakespanError(f"--args must be a JSON list of positional arguments (got an object: pass keyword "
                                f"arguments as --kwargs '{call_args.strip()}')")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise MakespanError("--args must be a JSON list and --kwargs a JSON object")
        taken = sorted(set(kwargs) & SUBMIT_OPTIONS)
        if taken:
            raise ValidationError("kwargs", taken, "names of submit options, not arguments of the function: use "
                                  + ", ".join("--" + name.replace("_", "-") for name in taken))
        s = _settings()
        from makespan.models import load_fleet
        from makespan.redis_conn import connect

        client = Client(connect(s.redis_url), s, load_fleet(fleet) if fleet else None)
        from makespan import telemetry

        telemetry.setup_tracing("makespan-cli")  # the job's trace ids (nothing is exported at submit)
        job = client.submit(workload, *args, endpoint=endpoint, service_s=service_s, priority=priority,
                            idempotency_key=idempotency_key, delay_s=delay_s, deadline_s=deadline_s,
                            depends_on=depends_on, **kwargs)
        # a repeated idempotency key returns the existing job, at the priority it was submitted with
        from makespan.models import Priority

        level = Priority.parse(priority).name if job.created or quiet else job.status()["priority"]
    except SubmitOutcomeUnknown as e:
        outcome_unknown(e, quiet)
    except MakespanError as e:
        _fail(e)
    _warn_ignored(idempotency_key, job.id, job.ignored)
    if job.created:  # as a plain job's submit: say so when nothing would start it
        try:
            job_endpoint = client.r.hget(client.keys.job(job.id), "endpoint")
        except Exception:  # noqa: BLE001 - best effort: the job is written
            job_endpoint = None
        if job_endpoint:
            _warn_if_it_waits(client._producer, job_endpoint, delayed=bool(delay_s))
        _warn_ended_dependencies(client.r, client.keys, depends_on, delayed=bool(delay_s))
    typer.echo(job.id if quiet else json.dumps({"id": job.id, "created": job.created, "priority": level}))


@app.command()
def ready(workloads: list[str] = typer.Argument(None, help="workload function names that must be registered by a "
                                                          "live GPU worker"),
          timeout_s: float = typer.Option(60.0, help="give up after this long")):
    """Wait until a planner has published the fleet and leads it now (with pools: each pool that serves
    WORKLOADS, or every pool), and live GPU workers have registered WORKLOADS, whose endpoints
    the planner's fleet has (for scripts: `makespan ready NAME && python submit.py`). Exits 0 when ready, 1 with what is missing;
    1 at once, with the reason, for a name a live GPU worker refused to publish (it names an endpoint
    the fleet does not have). A Redis that does not answer yet is waited for too (exit 1 at the timeout); one that
    refuses the credentials or answers with an error (a database number it does not have): exit 2 at once."""
    import redis

    from makespan.redis_conn import AUTH_ERRORS, auth_failed
    from makespan.keys import Keys
    from makespan.redis_conn import connect
    from makespan.settings import redacted_url

    s = _settings()
    r, keys = connect(s.redis_url), Keys(s.key_prefix)
    deadline = time.monotonic() + timeout_s
    hinted = False
    while True:
        try:
            absent = [name for name in workloads or [] if not r.exists(keys.fn_live(name))
                      or held_only_by_the_dead_here(r, keys, name)]
            if absent and not hinted:  # a misspelt name: say so now, not after the whole timeout (a new user)
                hinted = _hint_misspelt(r, keys, absent, timeout_s)
            leaderless = _pools_without_a_leader(r, keys, [name for name in workloads or [] if name not in absent])
            missing = ([] if r.exists(keys.fleet) else [
                f"a planner (no fleet published under key prefix {keys.prefix!r} at {redacted_url(s.redis_url)}: "
                "MAKESPAN_KEY_PREFIX and MAKESPAN_REDIS_URL must be the planner's)"]) + [
                f"a planner leading {'pool ' + str(pool) if pool else 'the fleet'} (none leads now)"
                for pool in leaderless] + [f"workload {name!r}" for name in absent] + _endpoints_unplanned(
                r, keys, [name for name in workloads or [] if name not in absent])
            refused = {name: why for name in absent if (why := r.get(keys.fn_refused(name)))}
        except AUTH_ERRORS as e:  # Redis answered and refused the credentials: waiting cannot help
            _fail(auth_failed(s.redis_url, e))
        except (redis.ResponseError, redis.exceptions.InvalidResponse) as e:  # answered with an error (a
            # database number out of range, not Redis): waiting cannot help either
            from makespan.redis_conn import answered_with_error

            _fail(answered_with_error(s.redis_url, e))
        except Exception as e:  # noqa: BLE001 - Redis not reachable yet: wait for it too
            missing, refused = [f"Redis ({e})"], {}
        if not missing:
            typer.echo("ready")
            return
        if refused:  # a live worker will not publish it: waiting cannot help
            for name, why in refused.items():
                typer.echo(f"not ready: workload {name!r} is not published by its GPU worker: {why}", err=True)
            raise typer.Exit(1)
        if time.monotonic() >= deadline:
            typer.echo(f"not ready after {timeout_s:g} s: waiting for {', '.join(missing)}", err=True)
            _hint_live_names(r, keys, [name for name in workloads or [] if f"workload {name!r}" in missing])
            raise typer.Exit(1)
        time.sleep(0.2)


def _published_endpoints(r, keys, workloads: list[str]) -> tuple[Any, dict[str, str]]:
    """(the fleet the planner published, or None; each of ``workloads`` whose published
    definition names an endpoint -> that endpoint).

    Raises:
        redis.RedisError: Redis failed."""
    from makespan.cli_support import published_fleet
    from makespan.errors import MakespanError

    try:
        fleet = published_fleet(r, keys, required=False)
    except MakespanError:
        return None, {}
    if fleet is None or not workloads:
        return fleet, {}
    endpoints = {}
    for name, raw in zip(workloads, r.mget([keys.fn(name) for name in workloads])):
        try:
            endpoints[name] = json.loads(raw)["endpoint"]
        except (TypeError, ValueError, KeyError):
            pass
    return fleet, endpoints


def _endpoints_unplanned(r, keys, workloads: list[str]) -> list[str]:
    """What ``ready`` still waits for among the live ``workloads``: the planner's fleet to
    have each one's endpoint. A GPU worker checks a function's endpoint against its own
    fleet file; when the planner runs another one, every submit of it is refused (a user
    saw ``ready`` and then ``unknown endpoint``). [] when no fleet is published yet.

    Raises:
        redis.RedisError: Redis failed."""
    fleet, endpoints = _published_endpoints(r, keys, workloads)
    if fleet is None:
        return []
    return [f"the planner's fleet to have endpoint {endpoint!r} of workload {name!r} (the fleet it published, "
            f"{fleet.name!r}, has not: every submit of it is refused; start the planner with the GPU worker's "
            "fleet file)" for name, endpoint in endpoints.items()
            if endpoint is not None and endpoint not in fleet.endpoints]  # None: each submit names one


def _pools_without_a_leader(r, keys, workloads: list[str]) -> list[str | None]:
    """The pools no planner leads now (None: the implicit pool of a fleet without pools) among
    those that serve the endpoints of ``workloads`` (their published definitions), or among
    every published pool when none is named or their endpoints cannot be read; [] when no
    fleet is published (``ready`` waits for that first).

    Raises:
        redis.RedisError: Redis failed."""
    fleet, endpoints = _published_endpoints(r, keys, workloads)
    if fleet is None:
        return []
    serving = sorted({pool for endpoint in endpoints.values() if endpoint is not None
                      for pool in fleet.pools_serving(endpoint)})
    pools: list[str | None] = list(serving) or [pool.name for pool in fleet.pools] or [None]
    leaders = r.mget([keys.for_pool(pool).planner_leader for pool in pools])
    return [pool for pool, leader in zip(pools, leaders) if not leader]


def _hint_misspelt(r, keys, absent: list[str], timeout_s: float) -> bool:
    """While ``ready`` waits: for each of ``absent`` that no GPU worker ever registered and
    that is close to a live name, print the likely name on stderr (the wait goes on: a
    worker may still register it). Returns whether a live name was there to compare with
    (so it is said once)."""
    from makespan.registry import closest_name, live_names

    alive = live_names(r, keys)
    if not alive:
        return False
    ever = r.smismember(keys.fns, absent)
    for name, known in zip(absent, ever):
        close = None if known else closest_name(name, alive)
        if close:
            typer.echo(f"note: no GPU worker has registered workload {name!r}; did you mean {close!r}? (waiting up "
                       f"to {timeout_s:g} s for it all the same)", err=True)
    return True


def _hint_live_names(r, keys, absent: list[str]) -> None:
    """After ``ready`` timed out on ``absent`` workload names: print the live names (and
    the closest one to each absent name), to stderr."""
    if not absent:
        return
    import redis

    from makespan.registry import closest_name, live_names

    try:
        alive = live_names(r, keys)
        known = set() if alive else set(r.smembers(keys.fns))
    except (MakespanError, redis.RedisError):
        return
    if not alive and known:
        gone = ", ".join(sorted(name for name in absent if name in known))
        typer.echo("no GPU worker is live now: the workers that registered functions under key prefix "
                   f"{keys.prefix!r}{' (' + gone + ' among them)' if gone else ''} stopped, restart or died (start "
                   "one with `makespan gpu-worker --workloads MODULE`)", err=True)
        return
    if not alive:
        typer.echo(f"no GPU worker has registered any workload function under key prefix {keys.prefix!r} (start "
                   "one with `makespan gpu-worker --workloads MODULE`, with the same MAKESPAN_KEY_PREFIX and "
                   "MAKESPAN_REDIS_URL)", err=True)
        return
    typer.echo(f"live workload functions: {', '.join(alive)}", err=True)
    for name in absent:
        close = closest_name(name, alive)
        if close:
            typer.echo(f"did you mean {close!r} instead of {name!r}?", err=True)


@app.command()
def result(job_id: str, timeout_s: float | None = typer.Option(None, help="wait at most this long (default: "
                                                                            "until the job ends)"),
           no_wait: bool = typer.Option(False, "--no-wait", help="print what is stored now; do not wait"),
           as_json: bool = typer.Option(False, "--json", help="the result is printed as JSON already; with --json a "
                                        "job that failed, was cancelled or has not finished (or is unknown, its result expired, or Redis "
                                        "is unreachable) also prints one JSON "
                                        "object on stdout ({\"job\", \"state\", \"error\": {...}} or "
                                        "{\"job\", \"state\", \"reason\"}), the exit code as without it"),
           requests: bool = typer.Option(False, "--requests", help="print the job's request records instead (a "
                                         "request step's: one JSON line per request, with the first 200 "
                                         "characters of its answer), as stored now")):
    """Print a job's result as JSON (its workload function's return value). Exit codes: 0 the result printed;
    1 a function's error (its type, message and traceback printed) or a cancelled or failed job (its reason);
    2 an unknown job; 69 Redis unreachable (try again); 4 not finished yet (--no-wait, or --timeout-s passed): ask again
    later. A job that runs no workload function (a plain job, a workload's step) has no result: `null`, and a
    note says so; a request step's answers are its request records (--requests)."""
    import redis

    from makespan.client import Client
    from makespan.errors import JobCancelled, JobFailed, ResultTimeout, WorkloadError
    from makespan.redis_conn import connect

    s = _settings()
    client = Client(connect(s.redis_url), s)
    job = client.job(job_id)
    if requests:
        _print_requests(client, job_id)
        return
    try:
        # a Redis never reached: exit 69 at once, as every other command (the wait below rides out a
        # Redis that goes away mid-wait for 30 s: it said "connection lost ... retrying" first; a new user)
        client._redis_call(client.r.ping)
        value = job.result(timeout_s=0 if no_wait else timeout_s)
    except WorkloadError as e:
        if e.traceback.strip():  # none for an error of the worker's own (a result over the limit, a timeout)
            typer.echo(e.traceback.rstrip(), err=True)
        typer.echo(str(e), err=True)
        if as_json:
            typer.echo(json.dumps({"job": job_id, "state": "failed", "error": {
                "type": e.error_type, "message": e.message, "traceback": e.traceback, "attempt": e.attempt}},
                ensure_ascii=False))
        raise typer.Exit(1) from e
    except (JobCancelled, JobFailed) as e:
        typer.echo(str(e), err=True)
        if as_json:
            typer.echo(json.dumps({"job": job_id, "state": "cancelled" if isinstance(e, JobCancelled) else e.state,
                                   "reason": e.reason}, ensure_ascii=False))
        raise typer.Exit(1) from e
    except ResultTimeout as e:
        typer.echo(f"{e} (exit code {EXIT_NOT_FINISHED}: ask again later, or wait with `makespan result {job_id}`)",
                   err=True)
        if as_json:
            typer.echo(json.dumps({"job": job_id, "state": e.state, "reason": "not finished"}))
        raise typer.Exit(EXIT_NOT_FINISHED) from e
    except MakespanError as e:
        if as_json:  # an unknown job, an expired result (its job completed), Redis unreachable: exit 2 or 69
            from makespan.errors import ResultExpired

            typer.echo(json.dumps({"job": job_id, "state": "completed" if isinstance(e, ResultExpired) else None,
                                   "reason": str(e)}, ensure_ascii=False))
        _fail(e)
    except redis.RedisError as e:  # Redis answering with an error (a database number it does not have): exit 2
        if as_json:
            typer.echo(json.dumps({"job": job_id, "state": None, "reason": f"Redis answered with an error: {e}"},
                                  ensure_ascii=False))
        raise
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))
    if value is None and not client.r.hget(client.keys.job(job_id), "fn"):
        count = client.r.llen(client.keys.requests(job_id))
        answers = (f"; its {count} request record{'s' if count != 1 else ''}: `makespan result {job_id} --requests`"
                   if count else "")
        typer.echo(f"note: job {job_id} runs no workload function (a plain job or a workload's step): it has no "
                   f"result{answers}", err=True)


def _print_requests(client, job_id: str) -> None:
    """``result --requests``: the job's request records (``P:requests:{job}``), one JSON
    line each, as the GPU worker stored them; exit 2 for an unknown job."""
    import redis

    from makespan.producer import job_not_found

    try:
        known = client.r.exists(client.keys.job(job_id))
        records = client.r.lrange(client.keys.requests(job_id), 0, -1)
    except redis.RedisError as e:
        _fail(store_error(f"job {job_id}", e))
    if not known:
        _fail(job_not_found(job_id, client.keys, client.settings))
    if not records:
        typer.echo(f"note: job {job_id} has no request records (not a request step, not run yet, or its records "
                   "expired with it)", err=True)
    for record in records:
        typer.echo(record)


FLEET_IGNORED_HELP = "deprecated and ignored (a job is read without its fleet); kept so that old invocations work"


def _job_reader():
    """A Producer without a fleet: enough to read or cancel a job."""
    from makespan.keys import Keys
    from makespan.producer import Producer
    from makespan.redis_conn import connect

    s = _settings()
    return Producer(connect(s.redis_url), Keys(s.key_prefix), None, s)


@app.command()
def status(job_id: str, fleet: Path | None = typer.Option(None, "--fleet", hidden=True, help=FLEET_IGNORED_HELP),
           as_json: bool = typer.Option(False, "--json", help="the output is JSON already (as `why --json` and "
                                        "`jobs --json`): accepted, changes nothing")):
    """Print a job's record as JSON: times in unix s (e.g. submitted_at) and ISO-8601 UTC (submitted_at_utc)."""
    ignored_fleet_option(fleet, "status")
    try:
        typer.echo(json.dumps(_job_reader().status(job_id), indent=2))
    except MakespanError as e:
        _fail(e)


@app.command()
def cancel(job_ids: list[str] = typer.Argument(None, help="job ids (or none, with filters)"),
           state: list[str] = typer.Option(None, "--state", help="with no JOB_IDS: cancel the jobs in this state: "
                                           "queued, delayed, leased or running (repeatable; default queued and "
                                           "delayed)"),
           endpoint: str | None = typer.Option(None, "--endpoint", help="with no JOB_IDS: only jobs of this endpoint"),
           priority: str | None = typer.Option(None, "--priority", help="with no JOB_IDS: only jobs of this level"),
           pool: str | None = typer.Option(None, "--pool", help="with no JOB_IDS: only jobs of this pool"),
           dry_run: bool = typer.Option(False, "--dry-run", help="with filters: list the jobs it would cancel, "
                                        "cancel nothing"),
           fleet: Path | None = typer.Option(None, "--fleet", hidden=True, help=FLEET_IGNORED_HELP)):
    """Cancel a job (queued: removed at once; running: a workload function sees ctx.cancelled, a simulated
    cold start or execute is cut short, anything else stops at its next phase). Prints one word: cancelled (this
    call cancelled the queued or delayed job) or cancel_requested (leased or running: it stops at its next phase
    boundary), exit 0; for a job that had already ended, how it ended (cancelled, completed or failed) and, on
    stderr, when: exit 5, nothing was cancelled. Exit 2: an unknown job; 69: Redis unreachable. Several JOB_IDS,
    or filters (--state, --endpoint, --priority, --pool) instead of ids: one line per job (`ID OUTCOME`) and a
    count on stderr; exit 0, 2 when an id was unknown (the other ids are still handled), 5 when every job had
    already ended (filters that match no job: "no job", exit 0)."""
    ignored_fleet_option(fleet, "cancel")
    from makespan import telemetry

    telemetry.setup_cli_tracing()  # a queued or delayed job cancelled here: its root span ends here
    filtered = bool(state or endpoint or priority or pool)
    job_ids = list(dict.fromkeys(job_ids or []))  # an id given twice is one id (`cancel A A` as `cancel A`)
    if job_ids and filtered:
        _fail(MakespanError("give job ids or filters (--state, --endpoint, --priority, --pool), not both"))
    if not job_ids and not filtered:
        _fail(MakespanError("give a job id, or filters (e.g. --endpoint E --state queued) to cancel many"))
    if filtered or len(job_ids) > 1:
        _cancel_many(job_ids or [], tuple(state or ()), endpoint, priority, pool, dry_run)
        return
    job_id = job_ids[0]
    try:
        outcome = _job_reader().cancel_outcome(job_id)
    except MakespanError as e:
        _fail(e)
    typer.echo(outcome.state)
    if outcome.already_ended:
        when = f" at {utc_text(outcome.finished_at)}" if outcome.finished_at is not None else ""
        typer.echo(f"job {job_id} had already ended ({outcome.state}{when}): nothing to cancel", err=True)
        raise typer.Exit(EXIT_ALREADY_ENDED)
    if outcome.requested_before:
        typer.echo(f"job {job_id}: its cancel was already requested; it stops at its next phase boundary", err=True)


CANCEL_MANY_MAX = 1_000_000  # jobs one filtered `makespan cancel` takes at most (more: it says so)


def _cancel_many(job_ids: list[str], states: tuple[str, ...], endpoint: str | None, priority: str | None,
                 pool: str | None, dry_run: bool) -> None:
    """``makespan cancel`` of several ids, or of the jobs the filters select (as ``makespan
    jobs`` lists them: waiting, leased or running ones only)."""
    from makespan.cli_why import LEASED, WAITING, scan_jobs

    reader = _job_reader()
    more_note = ""
    if not job_ids:
        bad = [s for s in states if s not in (*WAITING, *LEASED)]
        if bad:
            _fail(ValidationError("state", bad[0], f"cancel takes {', '.join((*WAITING, *LEASED))} (an ended job "
                                                   "has nothing to cancel)"))
        try:
            rows, cut_at = scan_jobs(reader.r, reader.keys, reader.settings, states or WAITING, endpoint, priority,
                                     limit=CANCEL_MANY_MAX, pool=pool)
        except MakespanError as e:
            _fail(e)
        job_ids = [row["id"] for row in rows]
        if len(rows) >= CANCEL_MANY_MAX or cut_at is not None:  # said, not a silent cap
            more_note = (f"; more jobs may match (one command takes at most {CANCEL_MANY_MAX:,}, reading "
                         f"{cut_at or 4 * CANCEL_MANY_MAX:,} ids of each list): run it again")
        if dry_run:
            for row in rows:
                typer.echo(f"{row['id']} {row['state']}")
            typer.echo(f"{len(rows)} job{'' if len(rows) == 1 else 's'} would be cancelled (--dry-run: nothing cancelled)"
                       + more_note, err=True)
            return
    counts: dict[str, int] = {}
    unknown = 0
    def outcomes_as_cancelled():  # a chunk's lines are printed before the next chunk is sent: a Redis that
        for first in range(0, len(job_ids), 500):  # fails midway leaves what was cancelled said
            part = job_ids[first:first + 500]
            try:
                yield from zip(part, reader.cancel_outcomes(part))
            except MakespanError as e:
                if first:  # some were cancelled: the exit code's "nothing written" would not hold alone
                    typer.echo(f"the {first:,} jobs listed above were answered before Redis failed; of the "
                               f"{len(job_ids) - first:,} left some may be cancelled, none was answered: run the "
                               "same command again for the rest", err=True)
                _fail(e)

    for job_id, outcome in outcomes_as_cancelled():
        if outcome is None:
            typer.echo(f"{job_id} unknown", err=True)
            unknown += 1
            continue
        said = f"already {outcome.state}" if outcome.already_ended else outcome.state
        typer.echo(f"{job_id} {said}")
        counts[said] = counts.get(said, 0) + 1
    parts = [f"{count} {said}" for said, count in sorted(counts.items())] + ([f"{unknown} unknown"] if unknown else [])
    typer.echo((", ".join(parts) or "no job") + more_note, err=True)
    if unknown:
        raise typer.Exit(2)
    if counts and all(said.startswith("already ") for said in counts):  # as one id's: nothing was cancelled
        raise typer.Exit(EXIT_ALREADY_ENDED)


REPORT_HELP = "where to write the report JSON too; default: report.json in the current folder, unless --run-dir is given"


def _report_path(report: Path | None, run_dir: Path | None) -> Path | None:
    """The extra copy of a live run's report: ``--report``, else ./report.json when no
    ``--run-dir`` was given (the run directory always holds its own report.json)."""
    if report is not None:
        return report
    return None if run_dir is not None else Path("report.json")


@app.command()
def demo(report: Path | None = typer.Option(None, help=REPORT_HELP),
         jobs: int = typer.Option(200, help="trace jobs to submit (besides the render-cards pipeline)"),
         seed: int = typer.Option(0, help="seed of the trace-to-job mapping"),
         policy: str | None = typer.Option(None, help=LIVE_POLICY_HELP),
         run_dir: Path | None = typer.Option(None, help="directory for events, report and Gantt chart")):
    """The main job on one machine: Redis (yours or an embedded one), a planner and GPU workers for a simulated 8-GPU fleet, the render pipeline with real endpoint processes, then a real-trace workload plus the render-cards pipeline (about 90 s of wall time, 80–120 s for 2 to 200 jobs: the time scale adapts to --jobs); prints the report, writes it and a Gantt chart."""
    from makespan.demo import run_demo

    try:
        out = run_demo(report_path=_report_path(report, run_dir), n_jobs=jobs, seed=seed, policy=policy,
                       run_dir=run_dir)
    except MakespanError as e:
        _fail(e)
    raise typer.Exit(0 if out["jobs"]["completed"] == out["jobs"]["submitted"] else 1)


@app.command()
def replay(trace: Path, fleet: Path = FleetOpt, speedup: float = typer.Option(10000.0, help="time compression N×"),
           report: Path | None = typer.Option(None, help=REPORT_HELP), start: int = typer.Option(0, help="first trace row"),
           limit: int = typer.Option(200, help="trace rows to replay"),
           seed: int = typer.Option(0, help="seed of the trace-to-job mapping"),
           policy: str | None = typer.Option(None, help=LIVE_POLICY_HELP),
           run_dir: Path | None = typer.Option(None, help="directory for events, report and Gantt chart")):
    """Run the live system fed from a trace file (ITP, Alibaba or JSON lines), time compressed SPEEDUP times."""
    from makespan.demo import run_replay

    try:
        out = run_replay(trace, fleet, speedup=speedup, report_path=_report_path(report, run_dir), start=start,
                         limit=limit, seed=seed, policy=policy, run_dir=run_dir)
    except MakespanError as e:
        _fail(e)
    raise typer.Exit(0 if out["jobs"]["completed"] == out["jobs"]["submitted"] else 1)


@app.command()
def simulate(trace: Path, fleet: Path = FleetOpt, policy: str = typer.Option(SIMULATE_POLICY, help=SIMULATE_POLICY_HELP),
             seed: int = typer.Option(0, help="seed of the trace-to-job mapping (recorded in the report)"),
             report: Path | None = typer.Option(None, help="write the report JSON here too (folders are created; checked before the run)"),
             start: int = typer.Option(0, help="first trace row"),
             limit: int | None = typer.Option(None, help="rows to read (default: all)"),
             time_scale: float = typer.Option(1.0, help="divide submission and service times by this (ITP jobs run for hours: 20 makes 30-240 s cold starts matter)"),
             time_limit_s: float | None = typer.Option(None, show_default="1 s", help=f"time-limited policies ({_TIMED}): time limit per planning point, wall s (a simulation takes about that long per planning point)"),
             preemption: bool = typer.Option(True, help="CRITICAL/HIGH jobs preempt lower levels, as the live planner does (victims restart from zero)"),
             preemption_mode: str = typer.Option("plan", help=f"plan: {_SCORED} decide preemptions inside the plan by score ({_RULED} keep the rule), as the live planner does by default (MAKESPAN_PREEMPTION); rule: the fixed preemption rule for every policy; off: no preemption (as --no-preemption)"),
             restore: bool = typer.Option(True, help="set-point restores: planned after a group's last job, and when the fleet is idle, as the live planner does; --no-restore: none at all"),
             set_point_weight: float = typer.Option(0.0, help="score per GPU-second a set-point instance is absent in a plan (weight·s per GPU-s; 0: not weighed), as MAKESPAN_SET_POINT_WEIGHT for the live planner"),
             prewarm: bool = typer.Option(False, help="wake sleepers on idle GPU groups ahead of demand, as MAKESPAN_PREWARM=1 for the live planner (transitions.prewarm)"),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines on stderr")):
    """The planner in virtual time (no Redis) over a trace; prints the report JSON. Progress goes to stderr every few seconds of a long run."""
    try:
        sim = importlib.import_module("makespan.simulation")
    except ImportError:
        _fail(MakespanError("the simulator is not built yet"))
    last = [time.monotonic()]

    def progress(p: dict) -> None:
        if quiet or time.monotonic() - last[0] < SIM_PROGRESS_EVERY_S:
            return
        last[0] = time.monotonic()
        typer.echo(f"simulate: {p['planning_points']} planning points, t={p['t_s']:.0f} s, "
                   f"{p['submitted']} submitted, {p['queued']} queued, {p['completed']} completed, "
                   f"{p['wall_s']:.0f} s wall", err=True)
    if preemption_mode not in ("plan", "rule", "off"):
        _fail(ValidationError("--preemption-mode", preemption_mode, "must be plan, rule or off"))
    try:
        out = sim.run_simulation(str(trace), str(fleet), policy, seed, start=start, limit=limit,
                                 report_path=str(report) if report else None,
                                 preemption=preemption_mode if preemption and preemption_mode != "off" else False, restore=restore,
                                 time_scale=time_scale, time_limit_s=time_limit_s, progress=progress,
                                 set_point_weight=set_point_weight, prewarm=prewarm)
    except MakespanError as e:
        _fail(e)
    typer.echo(json.dumps(out, indent=2))


for _mod in ("makespan.cli_lifecycle", "makespan.cli_observe", "makespan.cli_workloads", "makespan.cli_why",
             "makespan.cli_transitions", "makespan.cli_hosts"):
    try:
        importlib.import_module(_mod).register(app)
    except ImportError:
        pass


def main() -> None:
    try:
        app()
    except MakespanError as e:  # pragma: no cover - commands translate their own
        try:
            _fail(e)
        except typer.Exit:
            sys.exit(2)


if __name__ == "__main__":
    main()
