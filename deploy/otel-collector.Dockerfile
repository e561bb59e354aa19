# The collector of docker-compose.yaml: the pinned otelcol-contrib binary on busybox, so the
# container can probe its own health_check extension (the upstream image is FROM scratch: no
# shell, no client to run a HEALTHCHECK with).
FROM otel/opentelemetry-collector-contrib:0.115.1 AS collector
FROM busybox:1.37.0
COPY --from=collector /otelcol-contrib /otelcol-contrib
USER 10001
ENTRYPOINT ["/otelcol-contrib"]
HEALTHCHECK --interval=10s --timeout=3s --retries=6 \
    CMD wget -q -O /dev/null http://127.0.0.1:13133/ || exit 1
