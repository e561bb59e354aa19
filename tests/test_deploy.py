"""docker-compose.yaml cannot run here (no Docker): check instead that its pieces fit together.
Every name, port, credential and path one service uses must be what another provides, the
images are pinned, and the worker's command is one the real worker accepts."""

from __future__ import annotations

import re
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
        "temporal",
        "temporal-ui",
        "journal-db",
        "worker",
        "otel-collector",
        "jaeger",
    }


def test_images_are_pinned_and_dependencies_exist() -> None:
    for name, service in SERVICES.items():
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
            continue
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", image), f"{name}: pin {image} to a version"
        depends = service.get("depends_on") or []
        for other in depends if isinstance(depends, list) else depends.keys():
            assert other in SERVICES, f"{name} depends on unknown {other}"


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
