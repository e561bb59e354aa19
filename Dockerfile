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

# the simulated payments service's file lives on a volume shared by the worker's restarts
VOLUME /data
ENTRYPOINT ["python", "-m", "workers.worker"]
CMD ["--target", "temporal:7233", "--task-queue", "support", "--payments", "/data/payments.db", "--tier", "2"]
