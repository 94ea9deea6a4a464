#!/usr/bin/env bash
# `make chart` (charts/chart.mk): helm lint and helm template of charts/rollouts-dispatch with the
# default values and each ci/*-values.yaml, then `kubectl apply --dry-run=server` of every
# rendering against a real kube-apiserver started by the Rust launcher
# (tests/src/bin/test-cluster.rs), then the RBAC of the ci rendering is applied for real and
# checked with `kubectl auth can-i` (least privilege). The cluster is stopped at the end, also on
# failure: SIGTERM to the PID started here, never by name.
#
# Environment (set by chart.mk): HELM, CARGO, K8S_BIN_ENV, CHART_DIR, CHART_OUT.
set -euo pipefail

: "${HELM:?}" "${CARGO:?}" "${K8S_BIN_ENV:?}" "${CHART_DIR:?}" "${CHART_OUT:?}"
RELEASE=rollouts-dispatch
NAMESPACE=rollouts-dispatch
# Renderings: "default" (values.yaml alone) and one per ci/<name>-values.yaml ("<name>").
VARIANTS=(default)
for f in "$CHART_DIR"/ci/*-values.yaml; do v=$(basename "$f" -values.yaml); VARIANTS+=("$v"); done
values_args() { if [ "$1" != default ]; then echo "-f $CHART_DIR/ci/$1-values.yaml"; fi; }
SA="system:serviceaccount:$NAMESPACE:$RELEASE"
SM_CRD=charts/testdata/servicemonitor-crd.yaml
START_TIMEOUT=${CHART_CLUSTER_START_TIMEOUT:-120}

KUBECTL=$(sed -n 's/^KUBECTL=//p' "$K8S_BIN_ENV")
[ -x "$KUBECTL" ] || { echo "chart: no kubectl in $K8S_BIN_ENV (run make k8s-bin)" >&2; exit 1; }

mkdir -p "$CHART_OUT"
rm -f "$CHART_OUT"/*.yaml "$CHART_OUT"/*.log
t0=$(date +%s)
since() { echo "$(( $(date +%s) - $1 ))s"; }

# --- lint -----------------------------------------------------------------------------------
t=$(date +%s)
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" lint "$CHART_DIR" --strict --namespace "$NAMESPACE" $(values_args "$v") >"$CHART_OUT/lint-$v.log" 2>&1 ||
    { cat "$CHART_OUT/lint-$v.log"; echo "chart: helm lint ($v values) FAILED" >&2; exit 1; }
done
echo "chart: helm lint --strict ok (${VARIANTS[*]}) in $(since "$t")"

# --- template -------------------------------------------------------------------------------
t=$(date +%s)
kinds() { grep -E '^kind: ' "$1" | awk '{print $2}' | sort | uniq -c | awk '{printf "%s%s=%s", sep, $2, $1; sep=" "}'; }
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$NAMESPACE" $(values_args "$v") >"$CHART_OUT/$v.yaml" 2>"$CHART_OUT/template-$v.log" ||
    { cat "$CHART_OUT/template-$v.log"; echo "chart: helm template ($v values) FAILED" >&2; exit 1; }
  echo "chart: template $v: $(kinds "$CHART_OUT/$v.yaml")"
done
echo "chart: helm template ok in $(since "$t")"

# --- dry run against a real kube-apiserver ----------------------------------------------------
t=$(date +%s)
nice -n 10 "$CARGO" build -q -p dispatch-tests --bin test-cluster
echo "chart: test-cluster built in $(since "$t")"

t=$(date +%s)
cluster_log="$CHART_OUT/test-cluster.log"
cluster_pid=""
stop_cluster() {
  local rc=$?
  if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -TERM "$cluster_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$cluster_pid" 2>/dev/null; then
      echo "chart: test-cluster $cluster_pid did not stop on SIGTERM, killing it" >&2
      kill -KILL "$cluster_pid" 2>/dev/null || true
    fi
    wait "$cluster_pid" 2>/dev/null || true
  fi
  return $rc
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The launcher binary itself (what `cargo run -p dispatch-tests --bin test-cluster` runs), started
# directly so that $! is its PID whatever wraps cargo; SIGTERM makes it stop its cluster.
target_dir=$("$CARGO" metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
launcher="$target_dir/debug/test-cluster"
[ -x "$launcher" ] || { echo "chart: no $launcher after cargo build" >&2; exit 1; }
K8S_BIN_ENV="$K8S_BIN_ENV" "$launcher" up chart >"$cluster_log" 2>&1 </dev/null &
cluster_pid=$!
kubeconfig=""
for _ in $(seq 1 $((START_TIMEOUT * 10))); do
  kubeconfig=$(sed -n 's/^ *export KUBECONFIG=//p' "$cluster_log" | head -n 1)
  [ -n "$kubeconfig" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || { cat "$cluster_log"; echo "chart: test-cluster exited before it was ready" >&2; exit 1; }
  sleep 0.1
done
[ -n "$kubeconfig" ] || { cat "$cluster_log"; echo "chart: test-cluster not ready within ${START_TIMEOUT}s" >&2; exit 1; }
export KUBECONFIG="$kubeconfig"
echo "chart: test cluster up in $(since "$t") (pid $cluster_pid, $("$KUBECTL" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n 1))"

t=$(date +%s)
# The namespaces the renderings put objects in (release, Argo CD, in-cluster Job namespaces)
# must exist for a dry run of namespaced objects; they are really created in this throwaway cluster.
for ns in $(for v in "${VARIANTS[@]}"; do cat "$CHART_OUT/$v.yaml"; done | sed -n 's/^  namespace: *//p' | tr -d '"' | sort -u); do
  "$KUBECTL" create namespace "$ns" >/dev/null
done
# ServiceMonitor: a minimal CRD first (charts/testdata/servicemonitor-crd.yaml), so it is dry-run too.
"$KUBECTL" apply -f "$SM_CRD" >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/servicemonitors.monitoring.coreos.com >/dev/null
for v in "${VARIANTS[@]}"; do
  "$KUBECTL" apply --dry-run=server --validate=strict -f "$CHART_OUT/$v.yaml" >"$CHART_OUT/dry-run-$v.log" 2>&1 ||
    { cat "$CHART_OUT/dry-run-$v.log"; echo "chart: kubectl apply --dry-run=server ($v values) FAILED" >&2; exit 1; }
  echo "chart: dry-run $v: $(grep -c '(server dry run)' "$CHART_OUT/dry-run-$v.log")/$(grep -c '^kind: ' "$CHART_OUT/$v.yaml") objects accepted"
done
echo "chart: dry run ok in $(since "$t")"

# --- RBAC of the test values, for real: what the server's ServiceAccount may and may not do ----
t=$(date +%s)
"$KUBECTL" apply -f "$CHART_OUT/test.yaml" >"$CHART_OUT/apply-test.log" 2>&1 ||
  { cat "$CHART_OUT/apply-test.log"; echo "chart: kubectl apply (test values) FAILED" >&2; exit 1; }
rbac_fail=0
# A SubjectAccessReview as the ServiceAccount (not `kubectl auth can-i`, which needs the resource
# in discovery: no Kargo / Argo CD CRDs are installed here).
can() { # can yes|no VERB RESOURCE[/SUBRESOURCE][.GROUP] [NAMESPACE]
  local want=$1 verb=$2 res=$3 ns=${4:-} group="" sub="" got
  case $res in *.*) group=${res#*.}; res=${res%%.*} ;; esac
  case $res in */*) sub=${res#*/}; res=${res%%/*} ;; esac
  got=$(printf '{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"%s","groups":["system:serviceaccounts","system:serviceaccounts:%s","system:authenticated"],"resourceAttributes":{"verb":"%s","group":"%s","resource":"%s","subresource":"%s","namespace":"%s"}}}' \
    "$SA" "$NAMESPACE" "$verb" "$group" "$res" "$sub" "$ns" |
    "$KUBECTL" create -f - -o jsonpath='{.status.allowed}')
  case $got in true) got=yes ;; *) got=no ;; esac
  if [ "$got" != "$want" ]; then echo "chart: RBAC: $verb $3 ${ns:+-n $ns} = $got, want $want" >&2; rbac_fail=1; fi
}
can yes create tokenreviews.authentication.k8s.io
can yes list stages.kargo.akuity.io team-a
can yes watch applications.argoproj.io argocd
can yes patch analysisruns.argoproj.io team-a
can yes list secrets argocd
can no  list secrets "$NAMESPACE"
can no  get secrets default
can yes create jobs.batch verification
can yes delete jobs.batch team-a
can yes get pods/log verification
can no  create jobs.batch default
can no  create pods verification
can no  update jobs.batch verification
can no  create deployments.apps "$NAMESPACE"
[ "$rbac_fail" = 0 ] || { echo "chart: RBAC check FAILED" >&2; exit 1; }
echo "chart: RBAC of the test values ok (14 can-i checks) in $(since "$t"); total $(since "$t0"); renderings in $CHART_OUT"

stop_cluster
cluster_pid=""
echo "chart: lint=ok template=ok dry_run=ok"
