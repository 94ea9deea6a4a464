#!/usr/bin/env bash
# Checks the image `build.sh` wrote (`make image`): its config (entrypoint, user 65532), then runs
# its entrypoint from the image's own root filesystem, as Kubernetes would run it with
# `readOnlyRootFilesystem: true` and `runAsUser: 65532`: unpacked, bind-mounted read-only, the
# server's TLS certificate and JWT key mounted read-only at /etc/rollouts-dispatch (a Secret
# volume), started with `chroot --userspec=65532:65532`. It must answer /live and /ready, serve
# `GET /v1/destinations` over TLS to a token it accepts, and run as uid 65532.
#
# Then it runs what an init container of the Rollouts controller runs (docs/install.md, "Deliver
# the plugin to the controller"): `rollouts-dispatch install-plugin --to DIR` in the same chroot, DIR a
# writable volume, and checks the copy is the release plugin, executable.
#
# It also checks that the Helm chart's default image is this one (repository and appVersion).
#
# usage: check.sh OUT_DIR HOST_BINARY HOST_PLUGIN CHART_DIR (HOST_BINARY: the same binary, to issue
# the token; HOST_PLUGIN: the release plugin the image must carry)
# last line: image: digest=sha256:… size_mib=X chroot_run=ok uid=65532
set -euo pipefail
out=$1 host_binary=$2 host_plugin=$3 chart=$4
work=$(mktemp -d)
root=$work/root
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  umount "$root/etc/rollouts-dispatch" 2>/dev/null || true
  umount "$root/tmp" 2>/dev/null || true
  umount "$root" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "image: $*" >&2; exit 1; }

config=$out/config.json
user=$(jq -r .config.User "$config")
[ "$user" = "65532:65532" ] || fail "config.User is $user, want 65532:65532"
entrypoint=$(jq -r '.config.Entrypoint | join(" ")' "$config")
[ "$entrypoint" = /usr/local/bin/rollouts-dispatch ] || fail "entrypoint is $entrypoint"
[ "$(jq -r '.config.Cmd | join(" ")' "$config")" = serve ] || fail "cmd is not serve"
[ "$(jq -r .architecture "$config")/$(jq -r .os "$config")" = amd64/linux ] || fail "platform is not linux/amd64"
for label in title version revision created source licenses; do
  [ -n "$(jq -r --arg l "org.opencontainers.image.$label" '.config.Labels[$l] // empty' "$config")" ] \
    || fail "label org.opencontainers.image.$label missing"
done
[ "$(jq -r .mediaType "$out/manifest.json")" = application/vnd.oci.image.manifest.v1+json ] \
  || fail "the manifest is not an OCI manifest"

version=$(jq -r '.config.Labels["org.opencontainers.image.version"]' "$config")
name=$(jq -r '.manifests[0].annotations["io.containerd.image.name"]' "$out/layout/index.json")
[ "$name" != null ] || fail "the layout's index names no image"
chart_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")
chart_repository=$(awk '/^image:/ {in_image=1; next} /^[^ #]/ {in_image=0} in_image && $1 == "repository:" {print $2; exit}' "$chart/values.yaml")
[ "$chart_repository:$chart_version" = "$name" ] \
  || fail "the chart's default image is $chart_repository:$chart_version, the image is $name: change image.repository in $chart/values.yaml or appVersion in $chart/Chart.yaml"

mkdir -p "$root"
tar --same-owner --numeric-owner -C "$root" -xf "$out/rootfs.tar"
[ "$(stat -c %u "$root/home/nonroot")" = 65532 ] || fail "/home/nonroot is not owned by 65532"
[ -z "$(find "$root" -perm -4000 -o -perm -2000 | head -1)" ] || fail "setuid/setgid file in the image"
# the mount point of the Secret volume (the kubelet creates it the same way)
mkdir -p "$root/etc/rollouts-dispatch"
secrets=$work/secrets
mkdir -p "$secrets"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$secrets/tls.key" -out "$secrets/tls.crt" 2>/dev/null
head -c 48 /dev/urandom | base64 > "$secrets/jwt.key"
chmod 0444 "$secrets"/*
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount --bind "$secrets" "$root/etc/rollouts-dispatch"
mount -o remount,bind,ro "$root/etc/rollouts-dispatch"
if touch "$root/written" 2>/dev/null; then fail "the root filesystem is writable"; fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api=$(free_port) admin=$(free_port)
chroot=$(command -v chroot)
mapfile -t env < <(jq -r '.config.Env[]' "$config")
env -i "${env[@]}" HOME=/home/nonroot "$chroot" --userspec=65532:65532 "$root" $entrypoint serve \
  --listen "127.0.0.1:$api" --admin-listen "127.0.0.1:$admin" \
  --tls-cert /etc/rollouts-dispatch/tls.crt --tls-key /etc/rollouts-dispatch/tls.key \
  --jwt-key-file /etc/rollouts-dispatch/jwt.key > "$work/serve.log" 2>&1 &
pid=$!
ready=
for _ in $(seq 100); do
  if curl -fsS "http://127.0.0.1:$admin/ready" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$ready" ] || { cat "$work/serve.log" >&2; fail "the server in the chroot never became ready"; }
curl -fsS "http://127.0.0.1:$admin/live" >/dev/null || fail "/live failed"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 65532 ] || fail "the server runs as uid $uid"
token=$("$host_binary" token issue --key-file "$secrets/jwt.key" --project '*' --ttl 5m 2>/dev/null)
reply=$(curl -fsS --cacert "$secrets/tls.crt" -H "Authorization: Bearer $token" \
  "https://localhost:$api/v1/destinations") || { cat "$work/serve.log" >&2; fail "GET /v1/destinations over TLS failed"; }
jq -e 'type == "array"' <<<"$reply" >/dev/null || fail "GET /v1/destinations answered $reply"
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
# The init container: an emptyDir (here a writable directory on the image's /tmp) shared with the
# controller, written as uid 65532.
shared=$work/shared
mkdir -p "$shared" && chown 65532:65532 "$shared"
mount --bind "$shared" "$root/tmp"
installed=$(env -i "${env[@]}" HOME=/home/nonroot "$chroot" --userspec=65532:65532 "$root" $entrypoint \
  install-plugin --to /tmp 2>&1) || fail "install-plugin in the chroot failed: $installed"
want=$(sha256sum "$host_plugin" | cut -d' ' -f1)
[ "$installed" = "installed /tmp/rollouts-dispatch-plugin sha256=$want" ] \
  || fail "install-plugin said '$installed', want the release plugin's sha256 $want"
[ "$(sha256sum "$shared/rollouts-dispatch-plugin" | cut -d' ' -f1)" = "$want" ] || fail "the installed plugin differs"
[ -x "$shared/rollouts-dispatch-plugin" ] || fail "the installed plugin is not executable"
echo "image: install-plugin copied the release plugin (sha256=$want)"
digest=$(cat "$out/digest")
size=$(jq '[.layers[].size] + [.config.size] | add' "$out/manifest.json")
size_mib=$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "image: digest=$digest size_mib=$size_mib chroot_run=ok uid=$uid"
