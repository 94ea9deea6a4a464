# Image of the rollouts-dispatch server and agent (`rollouts-dispatch serve` / `agent`), for those
# who build with Docker. `make image` builds the same image without Docker (image/build.sh: crane,
# an empty base, one layer) and runs it from its root filesystem as uid 65532 (image/check.sh);
# that is the image tested and shipped by `make dist`.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Static (no libc in the image), as `make server-release` and `make plugin-release` build them; the
# plugin rides along for `rollouts-dispatch install-plugin` (an init container of the controller).
RUN RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      --target x86_64-unknown-linux-gnu -p dispatch-server --bin rollouts-dispatch \
      -p dispatch-metric-provider --bin rollouts-dispatch-plugin
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot /rootfs/usr/local/bin \
 && chmod 1777 /rootfs/tmp && chmod 0700 /rootfs/home/nonroot && chown 65532:65532 /rootfs/home/nonroot \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group \
 && printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && cp target/x86_64-unknown-linux-gnu/release/rollouts-dispatch \
       target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin /rootfs/usr/local/bin/

# Nothing but the two binaries, users, CA certificates; no shell; non-root (uid 65532, as the chart).
FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/rollouts-dispatch"]
CMD ["serve"]
