# The hourglass image: the three programs (hourglass, hourglass-agent,
# hourglass-aggregator) on Debian bookworm-slim, run as the non-root user 10001. They are
# one binary, `hourglass`, which runs the program it is called as: hourglass-agent and
# hourglass-aggregator are links to it (the servers' code and RocksDB once, not thrice).
#
#   docker build -t hourglass:0.1.0 .
#   docker run -p 7700:7700 -p 7701:7701 -v hourglass:/var/lib/hourglass hourglass:0.1.0
#   docker run --rm hourglass:0.1.0 hourglass query distinct --metric visitors --aggregator HOST:7700
#
# The default command is the aggregator; another program runs by naming it, as above
# (the Helm chart in helm/hourglass sets the command of each role). The first build
# compiles RocksDB from source: about 10 minutes on 2 cores; later builds reuse the layer
# that holds it until Cargo.toml or Cargo.lock change.
#
# Works with the classic builder and with BuildKit (no registry-fetched syntax image, no
# cache mounts). Without a registry, point the two stages at local images:
#   --build-arg RUST_IMAGE=IMAGE      Debian bookworm with cargo and rustc on PATH
#   --build-arg RUNTIME_IMAGE=IMAGE   Debian bookworm(-slim)
# (.ci/image makes both from debootstrap and the host's toolchain.)

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
# What RocksDB's build needs from the system (libclang, clang's headers, a C++
# compiler), checked and installed by the same script a user runs on a machine.
COPY scripts/install-deps scripts/install-deps
RUN scripts/install-deps && rm -rf /var/lib/apt/lists/*

# The dependencies, RocksDB above all, in a layer of their own: the manifests and the
# lockfile, with empty sources (and an empty build script for the .proto files) for every
# target the manifests name, so that only a change of dependencies rebuilds it, not a
# change of a .proto file. A new workspace member needs its Cargo.toml listed here.
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY sketch/Cargo.toml sketch/Cargo.toml
COPY rpc/Cargo.toml rpc/Cargo.toml
COPY agent/Cargo.toml agent/Cargo.toml
COPY aggregator/Cargo.toml aggregator/Cargo.toml
RUN set -e; \
    echo 'fn main() {}' > rpc/build.rs; \
    for manifest in Cargo.toml */Cargo.toml; do \
        dir=$(dirname "$manifest"); \
        mkdir -p "$dir/src" "$dir/benches"; \
        echo 'fn main() {}' > "$dir/src/main.rs"; \
        : > "$dir/src/lib.rs"; \
        for bench in $(awk '/^\[\[bench\]\]/ { b = 1; next } b && /^name *=/ { gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; b = 0 }' "$manifest"); do \
            echo 'fn main() {}' > "$dir/benches/$bench.rs"; \
        done; \
    done; \
    cargo build --release --locked -p hourglass --bin hourglass; \
    rm -rf src benches */src */benches rpc/build.rs

# The sources. Touched, so cargo never takes the empty stubs' build for them.
COPY . .
RUN find . -path ./target -prune -o -name '*.rs' -exec touch {} + \
    && cargo build --release --locked -p hourglass --bin hourglass \
    && mkdir -p /out \
    && cp target/release/hourglass /out/ \
    && ln -s hourglass /out/hourglass-agent \
    && ln -s hourglass /out/hourglass-aggregator \
    && for b in hourglass hourglass-agent hourglass-aggregator; do \
        /out/$b --version | grep -q "^$b " || { echo "/out/$b is not the real $b"; exit 1; }; \
    done
# The release profile keeps line tables (debug = "line-tables-only") for our code; they
# are stripped here and the symbols kept, so backtraces still name functions. Build with
# --build-arg STRIP_DEBUG=0 to keep them.
ARG STRIP_DEBUG=1
RUN if [ "$STRIP_DEBUG" = 1 ]; then strip --strip-debug /out/hourglass; fi

FROM ${RUNTIME_IMAGE}
# ca-certificates for TLS to the aggregator; libstdc++ for RocksDB (the base has it, but
# say so).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
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
# The admin port's /healthz: HOURGLASS_ADMIN_LISTEN's port when set, else the
# aggregator's 7701, then the agent's 7711 (`hourglass health --help`).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["hourglass", "health"]
# No init process is needed: both servers handle SIGTERM (drain, flush, exit) as PID 1.
CMD ["hourglass-aggregator"]
