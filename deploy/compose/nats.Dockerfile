# The NATS server of deploy/compose, without a registry: the static nats-server binary
# that scripts/nats-server fetches (the pinned release the tests run), on the base image
# .ci/base-image makes. scripts/try-cluster builds it as hourglass-nats:VERSION from a
# context holding only that binary:
#
#   docker build -t hourglass-nats:2.15.1 --build-arg BASE_IMAGE=$(.ci/base-image) \
#     -f deploy/compose/nats.Dockerfile DIR_WITH_nats-server
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
COPY nats-server /usr/local/bin/nats-server
# Its own non-root user (the hourglass image's is 10001); the JetStream store is a volume.
RUN groupadd --gid 10002 nats \
    && useradd --uid 10002 --gid 10002 --home-dir /var/lib/nats --no-create-home \
        --shell /usr/sbin/nologin nats \
    && mkdir -p /var/lib/nats \
    && chown 10002:10002 /var/lib/nats \
    && nats-server --version
USER 10002:10002
VOLUME ["/var/lib/nats"]
# Clients, routes, monitoring.
EXPOSE 4222 6222 8222
# The monitoring port's /healthz answers 200 once JetStream is up and current with its
# meta leader. No curl in the base: bash's /dev/tcp.
HEALTHCHECK --interval=2s --timeout=3s --start-period=10s --retries=30 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8222 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["nats-server"]
CMD ["-c", "/etc/nats/nats.conf"]
