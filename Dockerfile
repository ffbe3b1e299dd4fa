# syntax=docker/dockerfile:1
# The hourglass image: the three programs (hourglass, hourglass-agent,
# hourglass-aggregator) on Debian bookworm-slim, run as the non-root user 10001.
#
#   docker build -t hourglass:0.1.0 .
#   docker run -p 7700:7700 -p 7701:7701 -v hourglass:/var/lib/hourglass hourglass:0.1.0
#   docker run --rm hourglass:0.1.0 hourglass query distinct --metric visitors --aggregator http://HOST:7700
#
# The default command is the aggregator; another program runs by naming it, as above
# (the Helm chart in helm/hourglass sets the command of each role). The first build
# compiles RocksDB from source: about 10 minutes on 2 cores.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
# RocksDB's bindings need libclang (bindgen); the image already has the C++ toolchain.
# No protoc: the build uses the vendored one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the crates and the compiled RocksDB between builds; the
# binaries are copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --workspace --locked \
    && mkdir -p /out \
    && cp target/release/hourglass target/release/hourglass-agent target/release/hourglass-aggregator /out/
# The release profile keeps line tables (debug = "line-tables-only"), RocksDB's included:
# the aggregator is ~475 MB with them and ~20 MB without. Symbols stay, so backtraces
# still name functions. Build with --build-arg STRIP_DEBUG=0 to keep them.
ARG STRIP_DEBUG=1
RUN if [ "$STRIP_DEBUG" = 1 ]; then strip --strip-debug /out/*; fi

FROM ${RUNTIME_IMAGE}
# ca-certificates for TLS to the aggregator; libstdc++ for RocksDB (the base has it, but
# say so).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
# A fixed UID and GID, which the chart's securityContext (runAsUser 10001) and any
# volume permissions rely on.
RUN groupadd --gid 10001 hourglass \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/hourglass \
        --no-create-home --shell /usr/sbin/nologin hourglass \
    && mkdir -p /var/lib/hourglass /var/lib/hourglass-agent \
    && chown 10001:10001 /var/lib/hourglass /var/lib/hourglass-agent
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/hourglass
# The aggregator's RocksDB (or an agent's checkpoint when the agent runs here).
ENV HOURGLASS_DATA_DIR=/var/lib/hourglass
VOLUME ["/var/lib/hourglass"]
# gRPC and admin of the aggregator; the agent uses 8125/udp, 7710 and 7711.
EXPOSE 7700 7701
# No init process is needed: both servers handle SIGTERM (drain, flush, exit) as PID 1.
CMD ["hourglass-aggregator"]
