# syntax=docker/dockerfile:1
# oncegate container image: a locked build with the `dist` profile (link-time optimized across the
# whole crate graph: the fastest code, the longest build; Cargo.toml), then a small runtime image
# that runs as a non-root user on a read-only root filesystem.
#   docker build -t oncegate .
#   docker run --rm -p 50051:50051 -e ONCEGATE_REDIS_URL=redis://redis:6379 \
#     -e ONCEGATE_CONFIG=/etc/oncegate/policies.toml -v $PWD/policies.toml:/etc/oncegate/policies.toml:ro oncegate
# It listens on 0.0.0.0, so it needs principals in the config (or TLS with client certificates);
# for a throwaway local run, -e ONCEGATE_INSECURE=true instead (the gate logs a loud warning).

# --- build: the Rust toolchain; protox compiles the proto in build.rs (no protoc needed).
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# The whole context (see .dockerignore): every target Cargo.toml declares must be present.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked --bin oncegate \
 && install -D -m 0755 target/dist/oncegate /out/oncegate

# --- runtime: glibc + CA certificates, no shell, no package manager, uid 65532 ("nonroot").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/oncegate /usr/local/bin/oncegate
USER 65532:65532
# The embedded store (when no Redis is configured) writes here; mount a volume for it.
WORKDIR /var/lib/oncegate
ENV ONCEGATE_LISTEN=0.0.0.0:50051 \
    ONCEGATE_DATA_DIR=/var/lib/oncegate/data \
    ONCEGATE_LOG_FORMAT=json
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/oncegate"]
CMD ["serve"]
