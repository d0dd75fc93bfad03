"""Static checks of compose/, the Dockerfile, the Grafana dashboard and the Procfile
(no docker engine here): they parse, every command exists, ports and URLs agree."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest
import yaml
from compose_spec import ComposeSpecification
from honcho.environ import parse_procfile

from makespan.keys import Keys
from makespan.metrics import Metrics, RedisStateCollector
from makespan.models import load_fleet

from .deploy_checks import (ROOT, check_project_command, have_redis_server, makespan_commands, option,
                            shell_commands, strip_env)

COMPOSE_DIR = ROOT / "compose"
MAKESPAN_SERVICES = ("planner", "gpu-worker", "observer", "flower")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def prometheus() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())


@pytest.fixture(scope="module")
def otel() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "otel-collector.yaml").read_text())


def targets(prom: dict) -> dict[str, list[str]]:
    return {sc["job_name"]: [t for c in sc["static_configs"] for t in c["targets"]] for sc in prom["scrape_configs"]}


def published(service: dict) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def test_compose_validates_against_the_spec(compose):
    spec = ComposeSpecification.model_validate(compose)
    assert set(spec.services) >= {"redis", "planner", "gpu-worker", "observer", "flower", "otel-collector",
                                  "prometheus", "grafana"}


def test_redis_persists_and_gpu_worker_reserves_gpus(compose):
    cmd = compose["services"]["redis"]["command"]
    assert option(cmd, "--appendonly") == "yes"
    assert any(v.endswith(":/data") for v in compose["services"]["redis"]["volumes"])
    devices = compose["services"]["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_every_service_command_exists(compose):
    for name in MAKESPAN_SERVICES:
        svc = compose["services"][name]
        assert svc["image"] == "makespan:latest", name
        assert check_project_command(svc["command"]) == [], (name, svc["command"])
    assert "makespan:latest" == compose["services"]["planner"]["image"]
    assert (COMPOSE_DIR / compose["services"]["planner"]["build"]["context"] /
            compose["services"]["planner"]["build"]["dockerfile"]).is_file()


def test_fleet_mounts_and_hosts_exist(compose):
    for name in MAKESPAN_SERVICES:
        svc = compose["services"][name]
        mounts = {v.split(":")[1]: COMPOSE_DIR / v.split(":")[0] for v in svc.get("volumes", [])}
        fleet_path = option(svc["command"], "--fleet")
        if fleet_path is None:
            continue
        assert fleet_path in mounts, (name, fleet_path)
        fleet = load_fleet(mounts[fleet_path])
        host = option(svc["command"], "--host")
        if host is not None:
            assert host in {h.name for h in fleet.hosts}


def test_bind_mounts_exist(compose):
    for name, svc in compose["services"].items():
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith((".", "/")):
                assert (COMPOSE_DIR / src).exists(), (name, src)


def test_metrics_ports_match_prometheus_targets(compose, prometheus):
    tg = {t for ts in targets(prometheus).values() for t in ts}
    ports = {}
    for name in ("planner", "gpu-worker", "observer"):
        port = compose["services"][name]["environment"]["MAKESPAN_METRICS_PORT"]
        ports[name] = port
        # a service in another's network namespace (the observer in the gpu-worker's) is reached by that name
        mode = compose["services"][name].get("network_mode", "")
        reached_as = mode.removeprefix("service:") if mode.startswith("service:") else name
        assert f"{reached_as}:{port}" in tg, name
    assert len(set(ports.values())) == len(ports)
    flower_port = option(compose["services"]["flower"]["command"], "--port")
    assert f"flower:{flower_port}" in tg and int(flower_port) in published(compose["services"]["flower"])
    for t in tg:
        host = t.split(":")[0]
        assert host == "localhost" or host in compose["services"], t


def test_the_observer_shares_the_gpu_workers_namespaces_and_machine_name(compose):
    """The observer probes and restarts the endpoint processes the GPU worker spawns: their
    loopback URLs and pids are only reachable from the GPU worker's network and process
    namespaces, and the observer acts only on instances of its own machine name."""
    observer, worker = compose["services"]["observer"], compose["services"]["gpu-worker"]
    assert observer["network_mode"] == observer["pid"] == "service:gpu-worker"
    assert observer["environment"]["MAKESPAN_MACHINE"] == worker["environment"]["MAKESPAN_MACHINE"]


def test_otel_endpoints_agree(compose, prometheus, otel):
    http_ep = otel["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    grpc_ep = otel["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    for name in ("planner", "gpu-worker", "observer"):
        url = urlparse(compose["services"][name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert url.hostname in compose["services"] and url.hostname == "otel-collector"
        assert url.port == int(http_ep.rsplit(":", 1)[1]), "OTLP/HTTP port"
    col = compose["services"]["otel-collector"]
    assert {int(http_ep.rsplit(":", 1)[1]), int(grpc_ep.rsplit(":", 1)[1])} <= published(col)
    mounted = {v.split(":")[1]: v.split(":")[0] for v in col["volumes"]}
    assert mounted[option(col["command"], "--config")] == "./otel-collector.yaml"
    pipe = otel["service"]["pipelines"]["traces"]
    assert set(pipe["receivers"]) <= set(otel["receivers"]) and set(pipe["exporters"]) <= set(otel["exporters"])
    reader = otel["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert f"otel-collector:{reader['port']}" in targets(prometheus)["otel-collector"]


def test_prometheus_and_grafana_agree(compose, prometheus):
    prom = compose["services"]["prometheus"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    assert mounted[option(prom["command"], "--config.file")] == "./prometheus.yml"
    ds = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    url = urlparse(ds["datasources"][0]["url"])
    assert url.hostname == "prometheus" and url.port in published(prom)
    assert f"localhost:{url.port}" in targets(prometheus)["prometheus"]
    prov = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/makespan.yaml").read_text())
    graf = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert graf[prov["providers"][0]["options"]["path"]] == "./grafana/dashboards"


def _default(value: str) -> str:
    """The default of a compose ``${VAR:-default}`` interpolation (else the value itself)."""
    m = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", value)
    return m.group(1) if m else value


def test_redis_urls_point_at_the_redis_service(compose):
    for name in MAKESPAN_SERVICES:
        url = urlparse(_default(compose["services"][name]["environment"]["MAKESPAN_REDIS_URL"]))
        assert url.hostname == "redis" and url.port in published(compose["services"]["redis"])


def test_sentinel_profile_has_a_replica_and_three_sentinels_of_the_primary(compose):
    svc = compose["services"]
    assert "--replicaof" in svc["redis-replica"]["command"] and "redis" in svc["redis-replica"]["command"]
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        assert svc[name]["profiles"] == ["sentinel"]
        assert "sentinel monitor makespan redis 6379 2" in " ".join(svc[name]["entrypoint"])
    # the Sentinel URL the file's header documents names exactly these services
    header = (COMPOSE_DIR / "compose.yaml").read_text()
    hosts = re.search(r"redis\+sentinel://([^/]+)/makespan/0", header).group(1).split(",")
    assert sorted(h.split(":")[0] for h in hosts) == ["sentinel-1", "sentinel-2", "sentinel-3"]


def _exported_names(r, keys: Keys) -> set[str]:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    m = Metrics(reg)
    for c in (m.completed, m.failed, m.preempted, m.wait):
        c.labels("HIGH")
    m.phase.labels("execute"), m.transition.labels("evict"), m.gpu_seconds.labels("busy"), m.incidents.labels("x")
    m.declare_hosts(["host-a"])  # what the observer declares for its fleet's hosts
    m.workload_runs.labels("w", "ok"), m.workload_progress.labels("w"), m.estimate_error.labels("w")  # per function
    m.leading.labels("")  # what a planner process sets as it starts (standing by)
    r.set(keys.fleet, json.dumps({"hosts": [{"name": "host-a"}]}))
    reg.register(RedisStateCollector(r, keys))
    return {s.name for fam in reg.collect() for s in fam.samples}


def test_dashboard_queries_use_exported_metrics(r, keys):
    dash = json.loads((COMPOSE_DIR / "grafana/dashboards/makespan.json").read_text())
    names = _exported_names(r, keys)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\bmakespan_[a-z_]+\b", e)}
    assert used and used <= names, used - names
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("queue depth", "wait", "utilization", "transition", "incident", "drain"):
        assert topic in titles, topic
    assert all(p["datasource"]["uid"] == "prometheus" for p in dash["panels"])


def test_dockerfile_copies_existing_paths():
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                if "*" not in src:
                    assert (ROOT / src).exists(), src
    assert re.search(r"^FROM python:3\.11", text, re.M)


@pytest.fixture(scope="module")
def procfile() -> dict[str, str]:
    return parse_procfile((ROOT / "Procfile").read_text()).processes


def test_procfile_commands_exist(procfile):
    assert set(procfile) >= {"redis", "planner", "observer", "flower"}
    assert have_redis_server()
    for name, line in procfile.items():
        for argv in shell_commands(line):
            _env, argv = strip_env(argv)
            if argv[0] in ("mkdir", "redis-server"):
                continue
            assert check_project_command(argv) == [], (name, argv)
    assert "report" in makespan_commands()


def test_procfile_runs_a_gpu_worker_per_fleet_host_with_distinct_ports(procfile):
    hosts, ports, fleets = [], [], set()
    for line in procfile.values():
        env, argv = strip_env(shell_commands(line)[-1])
        if "MAKESPAN_METRICS_PORT" in env:
            ports.append(env["MAKESPAN_METRICS_PORT"])
        if argv[:2] == ["makespan", "gpu-worker"]:
            hosts.append(option(argv, "--host"))
        if option(argv, "--fleet"):
            fleets.add(option(argv, "--fleet"))
    assert len(fleets) == 1
    fleet = load_fleet(ROOT / fleets.pop())
    assert sorted(hosts) == sorted(h.name for h in fleet.hosts)
    assert len(ports) == len(set(ports)) >= 3
    redis_argv = shell_commands(procfile["redis"])[-1]
    assert option(redis_argv, "--appendonly") == "yes"
