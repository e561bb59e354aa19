"""docker-compose.yaml cannot run here (no Docker): check instead that its pieces fit together.
Every name, port, credential and path one service uses must be what another provides, the
images are pinned (Temporal's to the release of the dev server these docs were checked on, or
newer), every long-running service has a healthcheck, the start order waits for health, the
worker image runs unprivileged with a HEALTHCHECK, and the worker's command is one the real
worker accepts."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from workers.worker import parse

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def test_the_stack_has_every_part() -> None:
    assert set(SERVICES) == {
        "postgresql",
        "temporal-schema",
        "temporal",
        "temporal-namespace",
        "temporal-ui",
        "journal-db",
        "worker",
        "otel-collector",
        "jaeger",
    }


#: an image pinned to a version, and to a digest where one was added
PINNED = re.compile(r"[\w./-]+:\d[\w.-]*(@sha256:[0-9a-f]{64})?")


def dockerfile(service: str) -> str:
    build = SERVICES[service]["build"]
    return (ROOT / build["context"] / build["dockerfile"]).read_text()


def test_images_are_pinned_and_dependencies_exist() -> None:
    for name, service in SERVICES.items():
        if "build" in service:
            for base in re.findall(r"^FROM (\S+)", dockerfile(name), flags=re.MULTILINE):
                assert PINNED.fullmatch(base), f"{name}: pin its base image {base} to a version"
        else:
            image = service["image"]
            assert PINNED.fullmatch(image), f"{name}: pin {image} to a version"
        depends = service.get("depends_on") or []
        for other in depends if isinstance(depends, list) else depends.keys():
            assert other in SERVICES, f"{name} depends on unknown {other}"


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def tag(service: str) -> str:
    return str(SERVICES[service]["image"]).split("@")[0].rpartition(":")[2]


def dev_server_versions() -> dict[str, str]:
    """What the temporal CLI the tests run says it embeds: ``Server`` and ``UI``."""
    cli = shutil.which("temporal") or str(ROOT / ".venv" / "bin" / "temporal")
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(Server|UI) (\d+\.\d+\.\d+)", out))


def test_temporal_is_the_release_the_docs_were_checked_on_or_newer() -> None:
    checked = dev_server_versions()
    assert set(checked) == {"Server", "UI"}, checked
    assert SERVICES["temporal"]["image"].startswith("temporalio/server:")  # not auto-setup
    assert version(tag("temporal")) >= version(checked["Server"])
    for job in ("temporal-schema", "temporal-namespace"):
        # the schema and the CLI of the same release as the server
        assert SERVICES[job]["image"].split("@")[0] == f"temporalio/admin-tools:{tag('temporal')}"
    assert SERVICES["temporal-ui"]["image"].startswith("temporalio/ui:")
    assert version(tag("temporal-ui")) >= version(checked["UI"])


def test_the_operator_guide_names_the_web_ui_it_was_checked_on() -> None:
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    checked = dev_server_versions()
    assert f"Temporal Web UI {checked['UI']}" in guide
    assert f"Server {checked['Server']}" in guide
    assert f"temporalio/ui:{tag('temporal-ui')}" in guide
    readme = (ROOT / "docs" / "operations" / "production.md").read_text()
    assert f"Temporal Server {tag('temporal')} on PostgreSQL" in readme
    assert f"Temporal Web UI {tag('temporal-ui')} (port 8080)" in readme


def one_shot_jobs() -> set[str]:
    """Services others wait for to finish (``service_completed_successfully``)."""
    return {
        other
        for service in SERVICES.values()
        if isinstance(service.get("depends_on"), dict)
        for other, how in service["depends_on"].items()
        if how.get("condition") == "service_completed_successfully"
    }


def test_every_long_running_service_has_a_healthcheck() -> None:
    jobs = one_shot_jobs()
    assert jobs == {"temporal-schema", "temporal-namespace"}
    for name, service in SERVICES.items():
        if name in jobs:
            # a job is retried a few times, then fails the start of what waits for it
            assert str(service["restart"]).startswith("on-failure:"), name
            assert "healthcheck" not in service
            continue
        if "healthcheck" in service:
            check = service["healthcheck"]
            assert not check.get("disable") and check["test"][0] in ("CMD", "CMD-SHELL"), name
        else:
            # else its image's own HEALTHCHECK (a service built here)
            assert "build" in service, f"{name} has no healthcheck"
            assert re.search(r"^HEALTHCHECK .*CMD", dockerfile(name), flags=re.M | re.S), name


def test_what_each_healthcheck_probes_is_what_the_service_serves() -> None:
    temporal = " ".join(SERVICES["temporal"]["healthcheck"]["test"])
    assert temporal.endswith("localhost 7233") and "7233:7233" in SERVICES["temporal"]["ports"]
    assert env("temporal")["BIND_ON_IP"] == "0.0.0.0"  # reachable from the other containers
    ui = " ".join(SERVICES["temporal-ui"]["healthcheck"]["test"])
    assert (
        "http://127.0.0.1:8080/api/v1/settings" in ui
        and "8080:8080" in SERVICES["temporal-ui"]["ports"]
    )
    for db in ("postgresql", "journal-db"):
        probe = " ".join(SERVICES[db]["healthcheck"]["test"])
        assert f"pg_isready -U {env(db)['POSTGRES_USER']}" in probe
    collector = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    health = collector["extensions"]["health_check"]["endpoint"]
    assert "health_check" in collector["service"]["extensions"]
    assert f"http://127.0.0.1:{host_port(health)[1]}/" in dockerfile("otel-collector")
    assert "http://127.0.0.1:14269/" in " ".join(SERVICES["jaeger"]["healthcheck"]["test"])


def depends(service: str) -> dict[str, str]:
    return {k: v["condition"] for k, v in SERVICES[service]["depends_on"].items()}


def test_the_start_order_waits_for_health_not_for_a_started_container() -> None:
    assert depends("temporal-schema") == {"postgresql": "service_healthy"}
    assert depends("temporal") == {"temporal-schema": "service_completed_successfully"}
    assert depends("temporal-namespace") == {"temporal": "service_healthy"}
    assert depends("temporal-ui") == {"temporal": "service_healthy"}
    assert depends("worker") == {
        "temporal": "service_healthy",
        "temporal-namespace": "service_completed_successfully",
        "journal-db": "service_healthy",
        "otel-collector": "service_healthy",
    }
    assert depends("otel-collector") == {"jaeger": "service_healthy"}
    # the namespace job creates the namespace the worker polls in
    job = " ".join(SERVICES["temporal-namespace"]["entrypoint"])
    assert f"namespace create -n {worker_args().namespace} --address temporal:7233" in job
    # the worker also retries its own connection (tests/test_worker_connect.py), for long enough
    assert worker_args().connect_timeout_s >= 60


def test_the_schema_job_sets_up_both_databases_the_server_reads() -> None:
    mounted, _, inside = SERVICES["temporal-schema"]["volumes"][0].partition(":")
    script = (ROOT / mounted).read_text()
    assert inside.removesuffix(":ro") in SERVICES["temporal-schema"]["entrypoint"]
    for db in ("temporal", "temporal_visibility"):  # the server image's default names
        assert db in script.split("for db in ")[1].split(";")[0]
    assert "--ep postgresql -u temporal -p 5432" in script
    assert env("temporal-schema")["SQL_PASSWORD"] == env("postgresql")["POSTGRES_PASSWORD"]
    assert script.count("setup-schema -v 0.0") == 2 and script.count("update-schema") == 2


def test_two_worker_replicas_can_run_side_by_side() -> None:
    """`docker compose up --scale worker=2`: no fixed name or host port pins one container,
    and every replica uses the one PostgreSQL journal and one signing key."""
    worker = SERVICES["worker"]
    assert "container_name" not in worker and not worker.get("ports")
    assert urlparse(worker_args().journal).hostname == "journal-db"
    assert "--scale worker=2" in (ROOT / "docker-compose.yaml").read_text()


def test_published_ports_do_not_collide() -> None:
    published = [int(str(p).split(":")[0]) for s in SERVICES.values() for p in s.get("ports") or []]
    assert len(published) == len(set(published)), published
    assert {7233, 8080, 16686} <= set(published)


def test_temporal_runs_on_its_postgresql() -> None:
    temporal, db = env("temporal"), env("postgresql")
    assert temporal["DB"].startswith("postgres")
    assert temporal["POSTGRES_SEEDS"] == "postgresql"
    assert (temporal["POSTGRES_USER"], temporal["POSTGRES_PWD"]) == (
        db["POSTGRES_USER"],
        db["POSTGRES_PASSWORD"],
    )
    assert temporal["DB_PORT"] == "5432"


def test_the_web_ui_and_the_worker_reach_temporal() -> None:
    ui_host, ui_port = host_port(env("temporal-ui")["TEMPORAL_ADDRESS"])
    assert ui_host == "temporal" and f"{ui_port}:{ui_port}" in SERVICES["temporal"]["ports"]
    args = worker_args()
    host, port = host_port(args.target)
    assert (host, port) == ("temporal", ui_port)


def worker_args(monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    """The worker's command line as compose gives it, parsed by the real worker."""
    import os

    saved = dict(os.environ)
    try:
        os.environ.update({k: v for k, v in env("worker").items() if not v.startswith("${")})
        return parse([str(a) for a in SERVICES["worker"]["command"]])
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_worker_s_journal_is_the_journal_database() -> None:
    url = urlparse(worker_args().journal)
    db = env("journal-db")
    assert url.scheme == "postgresql"
    assert (url.hostname, url.port) == ("journal-db", 5432)
    assert (url.username, url.password, url.path.lstrip("/")) == (
        db["POSTGRES_USER"],
        db["POSTGRES_PASSWORD"],
        db["POSTGRES_DB"],
    )
    assert env("worker")["INTERLOCK_SIGNING_KEY"].startswith("${INTERLOCK_SIGNING_KEY")
    # the simulated payments file is on the worker's volume
    assert worker_args().payments == Path("/data/payments.db")
    assert any(v.endswith(":/data") for v in SERVICES["worker"]["volumes"])


def test_telemetry_flows_worker_to_collector_to_jaeger() -> None:
    endpoint = urlparse(worker_args().otlp_endpoint)
    collector = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    receivers = collector["receivers"]["otlp"]["protocols"]
    assert endpoint.hostname == "otel-collector"
    assert endpoint.port == host_port(receivers["http"]["endpoint"])[1]
    mounted = SERVICES["otel-collector"]["volumes"][0].split(":")
    assert (ROOT / mounted[0]).resolve() == (ROOT / "deploy" / "otel-collector.yaml")
    assert f"--config={mounted[1]}" in SERVICES["otel-collector"]["command"]
    exporter = collector["exporters"]["otlp/jaeger"]["endpoint"]
    assert host_port(exporter) == ("jaeger", 4317)
    assert env("jaeger")["COLLECTOR_OTLP_ENABLED"] == "true"
    for pipeline in collector["service"]["pipelines"].values():
        assert set(pipeline["receivers"]) <= set(collector["receivers"])
        assert set(pipeline["exporters"]) <= set(collector["exporters"])


def test_the_dockerfile_builds_what_compose_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "'.[otlp,postgres]'" in dockerfile and "-c requirements.lock" in dockerfile
    for copied in re.findall(r"^COPY (\S+)", dockerfile, flags=re.MULTILINE):
        assert (ROOT / copied).exists(), copied
    assert 'ENTRYPOINT ["python", "-m", "workers.worker"]' in dockerfile


def test_the_worker_image_runs_unprivileged_with_a_healthcheck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [i for i, line in enumerate(lines) if line.startswith("USER ")]
    assert users, "the worker image runs as root"
    user = lines[users[-1]].split()[1].split(":")[0]
    assert user not in ("root", "0")
    assert re.search(rf"useradd .*--uid {user}\b", "\n".join(lines))
    # nothing after USER runs as root again, and the volume exists owned by that user first
    assert not any(line.startswith("RUN ") for line in lines[users[-1] :])
    assert "chown interlock:interlock /data" in "\n".join(lines[: users[-1]])
    # the HEALTHCHECK probes the heartbeat file the worker writes (set by ENV, read by both)
    text = "\n".join(lines)
    health = re.search(r'^HEALTHCHECK .*CMD \["python", "-m", "workers.health"', text, re.M | re.S)
    assert health
    env_file = re.search(r"^ENV INTERLOCK_HEALTH_FILE=(\S+)", text, re.M)
    assert env_file
    monkeypatch.setenv("INTERLOCK_HEALTH_FILE", env_file.group(1))
    assert worker_args().health_file == Path(env_file.group(1))


@pytest.mark.server
async def test_the_ui_healthcheck_path_is_served_by_that_ui_release() -> None:
    """The dev server embeds the same ui-server: the path the compose healthcheck probes answers
    200 there, and reports the version the compose file pins."""
    import httpx

    from interlock_temporal.testing import DevServer

    server = await DevServer().start()
    try:
        assert server.ui_url is not None
        async with httpx.AsyncClient() as http:
            for _ in range(50):
                try:
                    answer = await http.get(f"{server.ui_url}/api/v1/settings")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        assert answer.status_code == 200
        assert answer.json()["Version"] == tag("temporal-ui")
    finally:
        await server.stop()
