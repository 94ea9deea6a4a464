#!/usr/bin/env bash
# Fuzzes the /v1 API from its OpenAPI document with schemathesis against a real
# `rollouts-dispatch serve` (no destinations: every dispatch answer is a documented error).
# Usage: tests/api-fuzz/run.sh SERVER_BINARY [MAX_EXAMPLES]
set -euo pipefail
bin=$1; examples=${2:-100}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
command -v schemathesis >/dev/null || python3 -m pip install -q schemathesis
head -c 48 /dev/urandom | base64 > "$work/jwt.key"
printf 'destinations: []\npolicy: {allowAll: true}\n' > "$work/server.yaml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
admin=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" token issue --key-file "$work/jwt.key" --project '*' --ttl 1h > "$work/token" 2>/dev/null
"$bin" serve --config "$work/server.yaml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
  --jwt-key-file "$work/jwt.key" --sync-timeout 2s > "$work/server.log" 2>&1 & pid=$!
for _ in $(seq 1 50); do curl -fs "127.0.0.1:$admin/ready" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fs -H "Authorization: Bearer $(cat "$work/token")" "127.0.0.1:$port/v1/openapi.json" > "$work/openapi.json"
cd "$here"
schemathesis run "$work/openapi.json" --url "http://127.0.0.1:$port" \
  -H "Authorization: Bearer $(cat "$work/token")" --checks all --max-examples "$examples" --seed 1
kill -0 "$pid" || { echo "api-fuzz: the server died"; tail -20 "$work/server.log"; exit 1; }
echo "api-fuzz: ok"
