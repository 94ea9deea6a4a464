#!/usr/bin/env bash
# Builds the OCI image of rollouts-dispatch without a Docker engine (`make image`).
#
# usage: build.sh CRANE BINARY PLUGIN OUT_DIR VERSION REVISION REPOSITORY
#
# The root filesystem holds only what the static binary needs: the binary (and beside it the static
# metric-provider plugin, which `rollouts-dispatch install-plugin` copies for the Rollouts
# controller from an init container), /etc/passwd and
# /etc/group naming uid/gid 65532 (nonroot, as distroless and the Helm chart use), the host's CA
# bundle (rustls-platform-verifier reads /etc/ssl/certs on Linux), /etc/nsswitch.conf (static glibc
# resolves names itself from /etc/hosts and DNS), /tmp and the home directory. One layer, on an
# empty OCI base, written reproducibly (sorted, numeric owners, mtime = the commit's time). crane
# assembles it against a registry it serves on loopback (in memory), sets the config (entrypoint,
# user, ports, OCI labels), validates it, and writes an OCI image layout archive.
set -euo pipefail
crane=$1 binary=$2 plugin=$3 out=$4 version=$5 revision=$6 repository=$7
created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
work=$(mktemp -d)
registry_pid=
cleanup() { [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

root=$work/rootfs
install -D -m 0755 "$binary" "$root/usr/local/bin/rollouts-dispatch"
install -D -m 0755 "$plugin" "$root/usr/local/bin/rollouts-dispatch-plugin"
mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
chmod 1777 "$root/tmp"
chmod 0700 "$root/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
tar --sort=name --mtime="@$created" --owner=0 --group=0 --numeric-owner \
    -C "$root" -cf "$work/layer.tar" --exclude=./home/nonroot .
# the home directory belongs to the user (uid/gid 65532)
tar --mtime="@$created" --owner=65532 --group=65532 --numeric-owner \
    -C "$root" -rf "$work/layer.tar" ./home/nonroot

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$crane" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
ref=127.0.0.1:$port/rollouts-dispatch:$version

"$crane" append --insecure --oci-empty-base -f "$work/layer.tar" -t "$ref" >/dev/null 2>"$work/crane.log" \
  || { cat "$work/crane.log" >&2; exit 1; }
created_rfc3339=$(date -u -d "@$created" +%Y-%m-%dT%H:%M:%SZ)
"$crane" mutate --insecure "$ref" -t "$ref" \
  --set-platform linux/amd64 \
  --entrypoint /usr/local/bin/rollouts-dispatch --cmd serve \
  --user 65532:65532 --workdir /home/nonroot \
  --exposed-ports 8443/tcp,9090/tcp \
  -e PATH=/usr/local/bin -e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  -l org.opencontainers.image.title=rollouts-dispatch \
  -l org.opencontainers.image.description="rollouts-dispatch server and agent: Argo Rollouts verifications on the clusters Kargo promoted to" \
  -l org.opencontainers.image.version="$version" \
  -l org.opencontainers.image.revision="$revision" \
  -l org.opencontainers.image.created="$created_rfc3339" \
  -l org.opencontainers.image.source=https://github.com/rollouts-dispatch/rollouts-dispatch \
  -l org.opencontainers.image.licenses=Apache-2.0 >/dev/null 2>"$work/crane.log" \
  || { cat "$work/crane.log" >&2; exit 1; }
"$crane" validate --insecure --remote "$ref" >/dev/null

rm -rf "$out"; mkdir -p "$out/layout"
"$crane" pull --insecure --format oci "$ref" "$out/layout" 2>"$work/crane.log" \
  || { cat "$work/crane.log" >&2; exit 1; }
# name the image in the layout's index, as `skopeo copy oci-archive:` / containerd import read it
jq --arg tag "$version" --arg name "$repository:$version" \
  '.manifests[0].annotations = {"org.opencontainers.image.ref.name": $tag, "io.containerd.image.name": $name}' \
  "$out/layout/index.json" > "$work/index.json" && mv "$work/index.json" "$out/layout/index.json"
"$crane" digest --insecure "$ref" > "$out/digest"
"$crane" config --insecure "$ref" > "$out/config.json"
"$crane" manifest --insecure "$ref" > "$out/manifest.json"
"$crane" export --insecure "$ref" "$out/rootfs.tar"
tar --sort=name --mtime="@$created" --owner=0 --group=0 --numeric-owner \
    -C "$out/layout" -cf "$out/rollouts-dispatch-$version-image-oci.tar" .
