# The demo worker: the support-case refund agent, gated, with its journal in PostgreSQL and
# its telemetry sent to the OpenTelemetry collector (see docker-compose.yaml).
FROM python:3.11-slim

WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

COPY pyproject.toml requirements.lock README.md ./
COPY interlock_temporal ./interlock_temporal
COPY workers ./workers
COPY workflows ./workflows
# the package with its extras (not editable): workers/ and workflows/ import from /app
RUN pip install --no-cache-dir -c requirements.lock '.[otlp,postgres]'

# the worker runs as an unprivileged user of its own; the simulated payments service's file
# lives on a volume (created owned by that user) shared by the worker's restarts
RUN useradd --system --uid 10001 --no-create-home --home-dir /app interlock \
    && mkdir /data && chown interlock:interlock /data
USER 10001:10001
VOLUME /data

# healthy while the worker, polling, keeps its heartbeat file fresh (every 5 s)
ENV INTERLOCK_HEALTH_FILE=/tmp/interlock-worker.health
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "workers.health", "--max-age-s", "30"]

ENTRYPOINT ["python", "-m", "workers.worker"]
CMD ["--target", "temporal:7233", "--task-queue", "support", "--payments", "/data/payments.db", "--tier", "2"]
