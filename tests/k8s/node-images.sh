#!/usr/bin/env bash
# Assembles the images the real test node runs, without a Docker engine or a public registry
# (`make real-node-bin`, tests/k8s/node.mk): one OCI image layout per recipe under OUT/<recipe>/,
# made from Debian's packages on this machine and from Go builds, with the crane of `make image`.
# The tests push each layout to a loopback registry under the public names that config/ uses
# (tests/src/cluster/node/images.rs maps names to recipes); nothing else in the examples changes.
#
# usage: node-images.sh CRANE OUT ROLLOUTS_CONTROLLER ROLLOUTS_VERSION
#
# Recipes, each as close to the public image's user and entrypoint as matters to a kubelet:
#   pause     the sandbox image: busybox `sleep` (a sandbox is killed with SIGKILL by containerd)
#   busybox   busybox:1.37: Debian's static busybox, its applets in /bin, runs as root (uid 0)
#   curl      curlimages/curl: curl and the libraries it links, busybox for sh, runs as the named
#             user curl_user (uid 100), which the kubelet cannot prove non-root by itself
#   rollouts  quay.io/argoproj/argo-rollouts: /bin/rollouts-controller (and the libraries it
#             links: upstream builds it static on distroless), CA bundle, USER 999
set -euo pipefail
crane=$1 out=$2 rollouts=$3 rollouts_version=$4
work=$(mktemp -d)
registry_pid=
cleanup() { [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$out"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$crane" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done

# busybox ROOT: the static busybox and a symlink per applet in ROOT/bin
busybox() {
  install -D -m 0755 /bin/busybox "$1/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ -e "$1/bin/$applet" ] || ln -s busybox "$1/bin/$applet"
  done
}

# with_libs ROOT BINARY DEST: BINARY at ROOT/DEST and every library it links at its own path
with_libs() {
  install -D -m 0755 "$2" "$1$3"
  local libs
  libs=$(ldd "$2" 2>/dev/null | grep -o '/[^ ]*' | sort -u || true)
  for lib in $libs; do
    install -D -m 0755 "$(readlink -f "$lib")" "$1$lib"
  done
}

# users ROOT LINES...: /etc/passwd and /etc/group with root and the given name:uid:gid users
users() {
  local root=$1; shift
  mkdir -p "$root/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
  for u in "$@"; do
    IFS=: read -r name uid gid <<<"$u"
    echo "$name:x:$uid:$gid:$name:/home/$name:/bin/sh" >> "$root/etc/passwd"
    echo "$name:x:$gid:" >> "$root/etc/group"
    mkdir -p "$root/home/$name"
  done
}

# image NAME ROOT MUTATE-ARGS...: one layer of ROOT on an empty base, the config, OUT/NAME
image() {
  local name=$1 root=$2; shift 2
  local ref=127.0.0.1:$port/$name:node
  mkdir -p "$root/tmp"; chmod 1777 "$root/tmp"
  tar --sort=name --mtime=@0 --numeric-owner -C "$root" -cf "$work/$name.tar" .
  "$crane" append --insecure --oci-empty-base -f "$work/$name.tar" -t "$ref" >/dev/null 2>"$work/crane.log" \
    || { cat "$work/crane.log" >&2; exit 1; }
  "$crane" mutate --insecure "$ref" -t "$ref" --set-platform linux/amd64 "$@" >/dev/null 2>"$work/crane.log" \
    || { cat "$work/crane.log" >&2; exit 1; }
  "$crane" pull --insecure --format oci "$ref" "$out/$name" 2>"$work/crane.log" \
    || { cat "$work/crane.log" >&2; exit 1; }
  echo "$name $("$crane" digest --insecure "$ref") $(du -sk "$out/$name" | cut -f1)KiB" >> "$out/index.txt.tmp"
}

r=$work/pause; busybox "$r"; users "$r"
image pause "$r" --entrypoint /bin/sleep --cmd 2147483647 --user 65535:65535

r=$work/busybox; busybox "$r"; users "$r"
image busybox "$r" --cmd sh -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

r=$work/curl; busybox "$r"; users "$r" curl_user:100:101
with_libs "$r" /usr/bin/curl /usr/bin/curl
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
chown -R 100:101 "$r/home/curl_user"
image curl "$r" --entrypoint curl --user curl_user --workdir /home/curl_user \
  -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -e CURL_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

r=$work/rollouts; users "$r"
with_libs "$r" "$rollouts" /bin/rollouts-controller
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$r/home/argo-rollouts"; chown 999:999 "$r/home/argo-rollouts"
image rollouts "$r" --entrypoint /bin/rollouts-controller --user 999 --workdir /home/argo-rollouts \
  -l "org.opencontainers.image.version=$rollouts_version"

mv "$out/index.txt.tmp" "$out/index.txt"
