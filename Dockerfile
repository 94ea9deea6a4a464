# Image of the rollouts-dispatch server and agent (`rollouts-dispatch serve` / `agent`).
# Build: docker build -t ghcr.io/rollouts-dispatch/rollouts-dispatch:0.1.0 .
# (No Docker engine runs in this project's CI; `make dist` builds the same binaries.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p dispatch-server --bin rollouts-dispatch

# glibc + CA certificates, no shell, non-root (uid 65532 matches the Helm chart).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/rollouts-dispatch /usr/local/bin/rollouts-dispatch
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/rollouts-dispatch"]
CMD ["serve"]
