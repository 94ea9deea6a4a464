#!/usr/bin/env bash
# `make chart` (charts/chart.mk): the README's values table up to date (charts/chart-docs.sh check:
# helm-docs into a temp dir, diffed with the committed README; checked first, its line printed
# just before the last line), the `config` schema of values.schema.json up to date with the
# server's config types (tests/src/bin/chart-config.rs), then helm lint and helm template of
# charts/rollouts-dispatch with the default values (plus the policy rule it requires) and each
# ci/*-values.yaml (every one is a "variant", charts/chart-variants.sh), and every documented server
# configuration (config/server.yaml and each ```yaml block of the Markdown files made of server
# config keys, an "example": linted, rendered, its rendered server.yaml parsed as `serve` does and
# holding every key of the example as written), renderings that must fail with a clear message,
# both CRDs rendered (templates/crds.yaml), values.yaml's words on the agent's grants what
# templates/agent-rbac.yaml renders, the RBAC golden test (charts/chart-rbac.sh: every grant
# against charts/rbac-allowlist.txt), then against a real kube-apiserver started by the Rust
# launcher (tests/src/bin/test-cluster.rs): the CRDs as a release of before had them applied for
# real and established, `kubectl apply --dry-run=server` of every rendering and example (and of a
# DispatchJob), then the renderings with RBAC checks applied for real (upgrading the CRDs), each as
# its own release in its own namespace (so that no two share a ServiceAccount or a ClusterRole),
# and their least privilege checked with SubjectAccessReviews; a DispatchJob created and its status
# patched as the kubernetes-store server's ServiceAccount. The cluster is stopped at the end, also
# on failure: SIGTERM to the PID started here, never by name.
#
# Environment (set by chart.mk): HELM, HELM_DOCS, CARGO, K8S_BIN_ENV, CHART_DIR, CHART_OUT.
set -euo pipefail

: "${HELM:?}" "${HELM_DOCS:?}" "${CARGO:?}" "${K8S_BIN_ENV:?}" "${CHART_DIR:?}" "${CHART_OUT:?}"
RELEASE=rollouts-dispatch
NAMESPACE=rollouts-dispatch
# Renderings: VARIANTS and values_args.
# shellcheck source=charts/chart-variants.sh
source charts/chart-variants.sh
SM_CRD=charts/testdata/servicemonitor-crd.yaml
CERT_CRD=charts/testdata/certificate-crd.yaml
PR_CRD=charts/testdata/prometheusrule-crd.yaml
DJ_CRD=$CHART_DIR/files/crds/dispatchjobs.yaml
DLR_CRD=$CHART_DIR/files/crds/dispatchlogrequests.yaml
# Documented server configurations (charts/chart-config: config/server.yaml and every ```yaml block
# of the Markdown files whose keys are server config keys), each rendered as an "example" variant.
EXAMPLE_SOURCES=(config/server.yaml)
while IFS= read -r f; do EXAMPLE_SOURCES+=("$f"); done < <(git ls-files '*.md' '*.md.gotmpl')
DJ_SAMPLE=charts/testdata/dispatchjob.yaml
# Renderings applied for real (variant release namespace): each as its own release in its own
# namespace; the RBAC checks below name their ServiceAccounts.
APPLY=("test $RELEASE $NAMESPACE" "kubernetes-store kstore kstore" "agent edge edge" "agent-namespaced edge2 edge2")
START_TIMEOUT=${CHART_CLUSTER_START_TIMEOUT:-120}

KUBECTL=$(sed -n 's/^KUBECTL=//p' "$K8S_BIN_ENV")
[ -x "$KUBECTL" ] || { echo "chart: no kubectl in $K8S_BIN_ENV (run make k8s-bin)" >&2; exit 1; }

mkdir -p "$CHART_OUT"
rm -f "$CHART_OUT"/*.yaml "$CHART_OUT"/*.log "$CHART_OUT"/*.data "$CHART_OUT"/*.pem
t0=$(date +%s)
since() { echo "$(( $(date +%s) - $1 ))s"; }

# --- README: helm-docs' values table (fails with "… is out of date: run `make chart-docs`") ----
docs_line=$(HELM_DOCS="$HELM_DOCS" CHART_DIR="$CHART_DIR" bash charts/chart-docs.sh check)

# --- the config schema, generated from the server's config types ------------------------------
t=$(date +%s)
nice -n 10 "$CARGO" build -q -p dispatch-tests --bin chart-config --bin test-cluster --bin chart-rbac
target_dir=$("$CARGO" metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
CHART_CONFIG="$target_dir/debug/chart-config"
"$CHART_CONFIG" schema "$CHART_DIR/values.schema.json"
echo "chart: chart-config, test-cluster and chart-rbac built in $(since "$t")"

# --- lint -----------------------------------------------------------------------------------
t=$(date +%s)
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" lint "$CHART_DIR" --strict --namespace "$NAMESPACE" $(values_args "$v") >"$CHART_OUT/lint-$v.log" 2>&1 ||
    { cat "$CHART_OUT/lint-$v.log"; echo "chart: helm lint ($v values) FAILED" >&2; exit 1; }
done
echo "chart: helm lint --strict ok (${VARIANTS[*]}) in $(since "$t")"

# --- the documented server configurations, each installed through the chart --------------------
t=$(date +%s)
mkdir -p "$CHART_OUT/examples"; rm -f "$CHART_OUT"/examples/*
EXAMPLES=()
"$CHART_CONFIG" examples "$CHART_OUT/examples" "${EXAMPLE_SOURCES[@]}" >"$CHART_OUT/examples.txt"
while read -r name ns values; do EXAMPLES+=("$name $ns $values"); done <"$CHART_OUT/examples.txt"
[ "${#EXAMPLES[@]}" -gt 0 ] || { echo "chart: no documented server configuration found (config/server.yaml?)" >&2; exit 1; }
checks=()
for e in "${EXAMPLES[@]}"; do
  read -r name ns values <<<"$e"
  "$HELM" lint "$CHART_DIR" --strict --namespace "$ns" -f "$values" >"$CHART_OUT/lint-example-$name.log" 2>&1 ||
    { cat "$CHART_OUT/lint-example-$name.log"; echo "chart: helm lint of documented config $name ($values) FAILED" >&2; exit 1; }
  "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$ns" -f "$values" >"$CHART_OUT/example-$name.yaml" 2>"$CHART_OUT/template-example-$name.log" ||
    { cat "$CHART_OUT/template-example-$name.log"; echo "chart: helm template of documented config $name ($values) FAILED" >&2; exit 1; }
  checks+=("example-$name=$CHART_OUT/example-$name.yaml=$values")
done
"$CHART_CONFIG" check "${checks[@]}"
echo "chart: ${#EXAMPLES[@]} documented server configurations lint, render and parse in $(since "$t")"

# --- template -------------------------------------------------------------------------------
t=$(date +%s)
kinds() { grep -E '^kind: ' "$1" | awk '{print $2}' | sort | uniq -c | awk '{printf "%s%s=%s", sep, $2, $1; sep=" "}'; }
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2046
  "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$NAMESPACE" $(values_args "$v") >"$CHART_OUT/$v.yaml" 2>"$CHART_OUT/template-$v.log" ||
    { cat "$CHART_OUT/template-$v.log"; echo "chart: helm template ($v values) FAILED" >&2; exit 1; }
  echo "chart: template $v: $(kinds "$CHART_OUT/$v.yaml")"
done
# Agent-only variants (server.enabled: false): nothing of the server may be rendered.
for v in agent agent-namespaced; do
  if grep -q 'app.kubernetes.io/component: server' "$CHART_OUT/$v.yaml"; then
    echo "chart: template $v: server.enabled is false, yet server objects are rendered" >&2; exit 1
  fi
done
for a in "${APPLY[@]}"; do
  read -r v rel ns <<<"$a"
  [ "$rel" = "$RELEASE" ] && continue
  # shellcheck disable=SC2046
  "$HELM" template "$rel" "$CHART_DIR" --namespace "$ns" $(values_args "$v") >"$CHART_OUT/apply-$v.yaml" 2>"$CHART_OUT/template-apply-$v.log" ||
    { cat "$CHART_OUT/template-apply-$v.log"; echo "chart: helm template ($v values, release $rel) FAILED" >&2; exit 1; }
done
# Values the chart must refuse, each with a message naming the keys to fix; on top of the default
# variant's values (a policy rule), except the first: values.yaml alone has no policy.
refused=0
refuse_with() { # refuse_with "MESSAGE PART" HELM-ARGS...
  local want=$1 out; shift
  if out=$("$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$NAMESPACE" "$@" 2>&1); then
    echo "chart: helm template $* rendered, want a failure mentioning \"$want\"" >&2; exit 1
  fi
  grep -qF -- "$want" <<<"$out" ||
    { echo "$out" >&2; echo "chart: helm template $* failed without \"$want\"" >&2; exit 1; }
  refused=$((refused + 1))
}
refuse() { refuse_with "$1" -f "$DEFAULT_VALUES" "${@:2}"; }
refuse_with "deny by default: with no policy the server dispatches nothing. Set config.policy.rules"
refuse "or config.policy.allowAll: true" --set 'config.policy.rules=null'
refuse "server.replicas=2 with agents.destinations needs agents.store: kubernetes" \
  --set server.replicas=2 --set 'agents.destinations[0].name=edge-1' --set signingKey.value=k
refuse "agents.destinations needs signingKey.value or signingKey.existingSecret" --set 'agents.destinations[0].name=edge-1'
refuse 'destination "prod-eu" is already in config.destinations' \
  -f "$CHART_DIR/ci/kubernetes-store-values.yaml" --set 'agents.destinations[0].name=prod-eu'
refuse "/agents/store" --set agents.store=etcd
refuse "agent.enabled needs agent.server" --set agent.enabled=true --set agent.tokenSecret.name=t
refuse "agent.enabled needs agent.tokenSecret.name" --set agent.enabled=true --set agent.server=https://cp.example.com
refuse "agent.enabled needs agent.workKeys" --set agent.enabled=true --set agent.server=https://cp.example.com --set agent.tokenSecret.name=t
refuse "agent.enabled needs agent.namespaces" --set agent.enabled=true --set agent.server=https://cp.example.com --set agent.tokenSecret.name=t \
  --set 'agent.workKeys={ed25519:9xvRIYv0cIUF2or2bjkmjJYxyB4ubKD35J+XTrFFhzU=}'
refuse "agent.namespaces and agent.allowClusterWide are both set" -f "$CHART_DIR/ci/agent-values.yaml" --set 'agent.namespaces={a}'
refuse "is plain http:// to a host that is not loopback" -f "$CHART_DIR/ci/agent-values.yaml" --set agent.server=http://cp.example.com:8443
refuse "inCluster.enabled needs inCluster.namespaces" --set inCluster.enabled=true
refuse "inCluster.enabled needs argocd.enabled: true" --set inCluster.enabled=true --set 'inCluster.namespaces={verification}'
refuse "inCluster.namespaces and inCluster.allowClusterWide are both set" -f "$CHART_DIR/ci/cluster-scope-values.yaml" --set 'inCluster.namespaces={a}'
refuse "tls.secretName and tls.certManager.issuerRef.name are both set" -f "$CHART_DIR/ci/kubernetes-store-values.yaml" --set tls.secretName=s
refuse "at '/rbac': additional properties 'analysisRunPatch' not allowed" --set rbac.analysisRunPatch=true
refuse "nothing to install" --set server.enabled=false
refuse "at '/monitoring/rules': additional properties 'enable' not allowed" --set monitoring.rules.enable=true
refuse "monitoring.rules.disabled: RolloutsDispatchAgentGone is not an alert of monitoring/rules.yaml" \
  --set monitoring.rules.enabled=true --set 'monitoring.rules.disabled={RolloutsDispatchAgentGone}'
refuse "the server refuses to start without authentication" --set 'server.tokenReviewAllow=null'
refuse "server.tokenReviewAllow system:serviceaccount:argo-rollouts:argo-rollouts matches no config.policy.callers entry" --set 'config.policy.callers=null'
refuse "server.tokenReviewAllow system:serviceaccount:kargo:kargo-controller matches no config.policy.callers entry" \
  --set 'server.tokenReviewAllow={system:serviceaccount:argo-rollouts:argo-rollouts,system:serviceaccount:kargo:kargo-controller}'
# What the renderings must contain (TLS by default, plain HTTP only on request, the agent pinned to
# a CA and limited to its namespaces).
has() { # has VARIANT TEXT: the rendering of VARIANT contains TEXT
  grep -qF -- "$2" "$CHART_OUT/$1.yaml" || { echo "chart: template $1: no \"$2\" in $CHART_OUT/$1.yaml" >&2; exit 1; }
}
hasnt() { ! grep -qF -- "$2" "$CHART_OUT/$1.yaml" || { echo "chart: template $1: unexpected \"$2\" in $CHART_OUT/$1.yaml" >&2; exit 1; }; }
has default "--tls-cert=/etc/rollouts-dispatch/tls/tls.crt"; hasnt default "--insecure-plaintext"
has default "type: kubernetes.io/tls"; has default "name: rollouts-dispatch-ca"
has cluster-scope "--insecure-plaintext"; hasnt cluster-scope "--tls-cert"
has kubernetes-store "kind: Certificate"; hasnt kubernetes-store "type: kubernetes.io/tls"
has agent-namespaced "--ca-file=/var/run/secrets/rollouts-dispatch/agent-ca/ca.crt"
has agent-namespaced "--namespaces=edge-jobs"; has agent-namespaced "--pod-security=restricted"
has agent-namespaced "--work-keys=/etc/rollouts-dispatch/work-keys/work.keys"
has agent-namespaced "ed25519:9xvRIYv0cIUF2or2bjkmjJYxyB4ubKD35J+XTrFFhzU="
# Monitoring (monitoring.*): the dashboard in the sidecar's namespace with its label, every alert
# but the one disabled, with the added label and the runbooks on the mirror; nothing by default.
has monitoring "grafana_dashboard: \"1\""; has monitoring '"uid": "rollouts-dispatch"'
has monitoring "kind: PrometheusRule"; has monitoring "team: platform"
has monitoring "alert: RolloutsDispatchAgentSilent"; hasnt monitoring "alert: RolloutsDispatchOverBudget"
has monitoring "runbook_url: https://git.example.com/platform/rollouts-dispatch/-/blob/main/docs/troubleshooting.md#agent-silent"
has monitoring 'summary: The agent of destination {{ $labels.destination }}'
hasnt default "kind: PrometheusRule"; hasnt default "grafana_dashboard"
# The in-cluster destination is limited to inCluster.namespaces (its caches watch only those).
has test "inClusterNamespaces:"; hasnt cluster-scope "inClusterNamespaces"
# Both CRDs are templates (upgraded with the release), kept on uninstall; none without the server
# or with crds.install=false.
for crd in dispatchjobs dispatchlogrequests; do has default "name: $crd.rollouts-dispatch.io"; has test "name: $crd.rollouts-dispatch.io"; done
has default "helm.sh/resource-policy: keep"
hasnt agent "kind: CustomResourceDefinition"; hasnt agent-namespaced "kind: CustomResourceDefinition"
if "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$NAMESPACE" -f "$DEFAULT_VALUES" --set crds.install=false | grep -q 'kind: CustomResourceDefinition'; then
  echo "chart: crds.install=false still renders a CustomResourceDefinition" >&2; exit 1
fi
refuse "config.agents and agents.destinations are both set" -f "$CHART_OUT/examples/config-server-yaml-values.yaml" --set 'agents.destinations[0].name=edge-9'
refuse "config.agents.namespace rollouts-dispatch is not the release namespace other" --namespace other -f "$CHART_OUT/examples/config-server-yaml-values.yaml"
# values.yaml's words on the agent's grants are what templates/agent-rbac.yaml renders.
"$CHART_CONFIG" agent-rbac "$CHART_OUT/agent.yaml" "$CHART_OUT/agent-namespaced.yaml" "$CHART_DIR/values.yaml"
echo "chart: helm template ok ($refused invalid value sets refused) in $(since "$t")"

# --- RBAC golden test: every grant of every rendering against charts/rbac-allowlist.txt ---------
t=$(date +%s)
HELM="$HELM" CARGO="$CARGO" CHART_DIR="$CHART_DIR" bash charts/chart-rbac.sh check "$CHART_OUT"
echo "chart: RBAC golden test in $(since "$t")"

# --- dry run against a real kube-apiserver ----------------------------------------------------
t=$(date +%s)
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
for ns in $(cat "$CHART_OUT"/*.yaml | sed -n 's/^  namespace: *//p' | tr -d '"' | sort -u); do
  "$KUBECTL" get namespace "$ns" >/dev/null 2>&1 || "$KUBECTL" create namespace "$ns" >/dev/null
done
# ServiceMonitor: a minimal CRD first (charts/testdata/servicemonitor-crd.yaml), so it is dry-run too.
"$KUBECTL" apply -f "$SM_CRD" >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/servicemonitors.monitoring.coreos.com >/dev/null
# cert-manager's Certificate likewise (charts/testdata/certificate-crd.yaml, a strict schema).
"$KUBECTL" apply -f "$CERT_CRD" >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/certificates.cert-manager.io >/dev/null
# PrometheusRule likewise (charts/testdata/prometheusrule-crd.yaml: the rule group's fields, strict).
"$KUBECTL" apply -f "$PR_CRD" >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/prometheusrules.monitoring.coreos.com >/dev/null
# The chart's CRDs as a release of before had them (crds/ then), for real; the renderings applied
# below upgrade them (templates/crds.yaml).
"$KUBECTL" apply --validate=strict -f "$DJ_CRD" -f "$DLR_CRD" >"$CHART_OUT/apply-crds.log" 2>&1 ||
  { cat "$CHART_OUT/apply-crds.log"; echo "chart: kubectl apply $DJ_CRD $DLR_CRD FAILED" >&2; exit 1; }
for crd in dispatchjobs dispatchlogrequests; do
  "$KUBECTL" wait --for=condition=Established --timeout=60s "crd/$crd.rollouts-dispatch.io" >/dev/null ||
    { echo "chart: CRD $crd.rollouts-dispatch.io not established" >&2; exit 1; }
done
"$KUBECTL" -n "$NAMESPACE" apply --dry-run=server --validate=strict -f "$DJ_SAMPLE" >"$CHART_OUT/dry-run-dispatchjob.log" 2>&1 ||
  { cat "$CHART_OUT/dry-run-dispatchjob.log"; echo "chart: kubectl apply --dry-run=server $DJ_SAMPLE FAILED" >&2; exit 1; }
echo "chart: CRD dispatchjobs.rollouts-dispatch.io established; a DispatchJob dry-run accepted"
VARIANTS_AND_EXAMPLES=("${VARIANTS[@]}")
for e in "${EXAMPLES[@]}"; do read -r name _ _ <<<"$e"; VARIANTS_AND_EXAMPLES+=("example-$name"); done
for v in "${VARIANTS_AND_EXAMPLES[@]}"; do
  "$KUBECTL" apply --dry-run=server --validate=strict -f "$CHART_OUT/$v.yaml" >"$CHART_OUT/dry-run-$v.log" 2>&1 ||
    { cat "$CHART_OUT/dry-run-$v.log"; echo "chart: kubectl apply --dry-run=server ($v values) FAILED" >&2; exit 1; }
  echo "chart: dry-run $v: $(grep -c '(server dry run)' "$CHART_OUT/dry-run-$v.log")/$(grep -c '^kind: ' "$CHART_OUT/$v.yaml") objects accepted"
done
echo "chart: dry run ok (${#VARIANTS[@]} variants, ${#EXAMPLES[@]} documented configs) in $(since "$t")"

# --- the RBAC renderings, for real: what each ServiceAccount may and may not do --------------
t=$(date +%s)
for a in "${APPLY[@]}"; do
  read -r v rel ns <<<"$a"
  f="$CHART_OUT/apply-$v.yaml"; [ "$rel" = "$RELEASE" ] && f="$CHART_OUT/$v.yaml"
  "$KUBECTL" apply -f "$f" >"$CHART_OUT/apply-$v.log" 2>&1 ||
    { cat "$CHART_OUT/apply-$v.log"; echo "chart: kubectl apply ($v values, release $rel in $ns) FAILED" >&2; exit 1; }
  echo "chart: applied $v as release $rel in namespace $ns: $(grep -cE ' (created|configured|unchanged)$' "$CHART_OUT/apply-$v.log") objects"
done
# The CRDs of before (applied from files above) upgraded by the renderings: both carry the release's
# labels and the keep policy now, and are established.
for crd in dispatchjobs dispatchlogrequests; do
  keep=$("$KUBECTL" get crd "$crd.rollouts-dispatch.io" -o jsonpath='{.metadata.annotations.helm\.sh/resource-policy}')
  [ "$keep" = keep ] || { echo "chart: CRD $crd.rollouts-dispatch.io not upgraded by the rendering (resource-policy: \"$keep\")" >&2; exit 1; }
  "$KUBECTL" wait --for=condition=Established --timeout=60s "crd/$crd.rollouts-dispatch.io" >/dev/null
done
echo "chart: CRDs dispatchjobs and dispatchlogrequests upgraded by the rendering (helm.sh/resource-policy: keep), established"
rbac_fail=0
sars=0
SA="" SA_NS=""
as() { SA_NS=$1; SA="system:serviceaccount:$1:$2"; } # as NAMESPACE SERVICEACCOUNT: the subject of the next checks
# A SubjectAccessReview as the ServiceAccount (not `kubectl auth can-i`, which needs the resource
# in discovery: no Kargo / Argo CD CRDs are installed here).
can() { # can yes|no VERB RESOURCE[/SUBRESOURCE][.GROUP] [NAMESPACE] (no namespace: cluster-wide)
  local want=$1 verb=$2 res=$3 ns=${4:-} group="" sub="" got
  case $res in *.*) group=${res#*.}; res=${res%%.*} ;; esac
  case $res in */*) sub=${res#*/}; res=${res%%/*} ;; esac
  got=$(printf '{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"%s","groups":["system:serviceaccounts","system:serviceaccounts:%s","system:authenticated"],"resourceAttributes":{"verb":"%s","group":"%s","resource":"%s","subresource":"%s","namespace":"%s"}}}' \
    "$SA" "$SA_NS" "$verb" "$group" "$res" "$sub" "$ns" |
    "$KUBECTL" create -f - -o jsonpath='{.status.allowed}')
  case $got in true) got=yes ;; *) got=no ;; esac
  sars=$((sars + 1))
  if [ "$got" != "$want" ]; then
    echo "chart: RBAC: $SA: $verb $3 $(if [ -n "$ns" ]; then echo "-n $ns"; else echo "(cluster-wide)"; fi) = $got, want $want" >&2; rbac_fail=1
  fi
}
# The server of the test values (memory store: no DispatchJobs).
as "$NAMESPACE" "$RELEASE"
can yes create tokenreviews.authentication.k8s.io
can yes get stages.kargo.akuity.io team-a
can no  list stages.kargo.akuity.io team-a
can yes get applications.argoproj.io argocd
can no  watch applications.argoproj.io argocd
# server.confirmRuns (default): AnalysisRuns listed and watched in every namespace, nothing more.
can yes list analysisruns.argoproj.io team-a
can yes watch analysisruns.argoproj.io team-a
can no  patch analysisruns.argoproj.io team-a
can no  get analysisruns.argoproj.io team-a
can yes list secrets argocd
can yes watch secrets argocd
can no  get secrets argocd
can no  list secrets "$NAMESPACE"
can no  get secrets default
can yes create jobs.batch verification
can yes delete jobs.batch team-a
can yes list pods verification
can yes watch jobs.batch team-a
can no  list pods
can no  watch jobs.batch
can no  get pods verification
can yes get pods/log verification
can no  create jobs.batch default
can no  create pods verification
can no  update jobs.batch verification
can no  create deployments.apps "$NAMESPACE"
can no  create dispatchjobs.rollouts-dispatch.io "$NAMESPACE"
# The agent of the test values: its own ServiceAccount, none of the server's grants.
as "$NAMESPACE" "$RELEASE-agent"
can yes create jobs.batch default
can yes watch pods default
can no  watch pods
can no  create jobs.batch verification
can no  list secrets argocd
can no  get secrets "$NAMESPACE"
can no  create tokenreviews.authentication.k8s.io
can no  list stages.kargo.akuity.io team-a
# The server with agents.store: kubernetes: DispatchJobs in its release namespace only.
as kstore kstore-rollouts-dispatch
for verb in get list watch create patch delete; do can yes "$verb" dispatchjobs.rollouts-dispatch.io kstore; done
can yes patch dispatchjobs/status.rollouts-dispatch.io kstore
for verb in get update; do can no "$verb" dispatchjobs/status.rollouts-dispatch.io kstore; done
can no  update dispatchjobs.rollouts-dispatch.io kstore
can no  deletecollection dispatchjobs.rollouts-dispatch.io kstore
can no  create dispatchjobs.rollouts-dispatch.io "$NAMESPACE"
can no  list dispatchjobs.rollouts-dispatch.io
can no  patch dispatchjobs/status.rollouts-dispatch.io default
# Published log requests of agent destinations (server/src/logs/board.rs), no more.
for verb in create list watch delete; do can yes "$verb" dispatchlogrequests.rollouts-dispatch.io kstore; done
for verb in get update patch; do can no "$verb" dispatchlogrequests.rollouts-dispatch.io kstore; done
can no  create dispatchlogrequests.rollouts-dispatch.io "$NAMESPACE"
can no  get secrets kstore
can no  create jobs.batch verification
# The orphan sweep (server.sweepOrphansEvery) and server.confirmRuns list and watch AnalysisRuns,
# and nothing more on them.
can yes list analysisruns.argoproj.io team-a
can yes watch analysisruns.argoproj.io team-a
can no  delete analysisruns.argoproj.io team-a
can no  patch analysisruns.argoproj.io team-a
# The agent alone (agent values, agent.allowClusterWide): Jobs and logs in every namespace, Pods
# listed and watched; never Secrets.
as edge edge-rollouts-dispatch-agent
for verb in create get list watch delete; do can yes "$verb" jobs.batch verification; done
can yes create jobs.batch default
can yes delete jobs.batch team-a
can yes list pods
can yes watch pods
can no  get pods verification
can yes get pods/log verification
can no  get secrets edge
can no  list secrets
can no  watch secrets
can no  get secrets kube-system
can no  update jobs.batch verification
can no  patch jobs.batch verification
can no  create pods verification
can no  delete pods verification
can no  create pods/exec verification
can no  get configmaps edge
can no  create dispatchjobs.rollouts-dispatch.io edge
can no  create tokenreviews.authentication.k8s.io
# The agent with agent.namespaces: [edge-jobs, verification]: Jobs, Pods and logs in those
# namespaces only; its caches list and watch each of them (--namespaces), never the cluster.
as edge2 edge-agent
can yes create jobs.batch edge-jobs
can yes get jobs.batch edge-jobs
can yes delete jobs.batch verification
can no  get jobs.batch default
can no  get pods edge-jobs
can yes list pods edge-jobs
can yes watch pods verification
can yes list jobs.batch verification
can yes watch jobs.batch edge-jobs
can yes get pods/log edge-jobs
can no  list jobs.batch
can no  watch jobs.batch
can no  list pods
can no  watch pods
can no  list pods default
can no  list jobs.batch kube-system
can no  create jobs.batch default
can no  create jobs.batch edge2
can no  delete jobs.batch default
can no  get pods/log default
can no  get secrets edge-jobs
can no  list secrets
[ "$rbac_fail" = 0 ] || { echo "chart: RBAC check FAILED" >&2; exit 1; }
echo "chart: RBAC ok ($sars SubjectAccessReviews, ${#APPLY[@]} releases) in $(since "$t")"

# --- a DispatchJob through the CRD as the kubernetes-store server: create, status, delete -------
# The status patch and the delete are bare PATCH and DELETE requests, as KubeStore sends them
# (server/src/store/kubernetes.rs): `kubectl patch` would GET the object first and so need a verb
# the server does not use. curl with the admin kubeconfig's token, impersonating the ServiceAccount.
t=$(date +%s)
kstore_sa=system:serviceaccount:kstore:kstore-rollouts-dispatch
dj=$(sed -n 's/^  name: *//p' "$DJ_SAMPLE" | head -n 1)
dj_url="$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')/apis/rollouts-dispatch.io/v1alpha1/namespaces/kstore/dispatchjobs/$dj"
as_kstore() { # as_kstore METHOD URL [MERGE-PATCH]: one request as the kstore server's ServiceAccount
  curl -sS --fail-with-body -X "$1" "$2" \
    --cacert "$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')" \
    -H "Authorization: Bearer $("$KUBECTL" config view --minify --raw -o jsonpath='{.users[0].user.token}')" \
    -H "Impersonate-User: $kstore_sa" -H "Impersonate-Group: system:serviceaccounts" \
    -H "Impersonate-Group: system:serviceaccounts:kstore" -H "Impersonate-Group: system:authenticated" \
    ${3:+-H "Content-Type: application/merge-patch+json" --data "$3"} -o /dev/null -w "$1 %{http_code}\n"
}
{
  "$KUBECTL" --as="$kstore_sa" -n kstore create -f "$DJ_SAMPLE" &&
  as_kstore PATCH "$dj_url/status" '{"status":{"phase":"Running","agent":"chart-check","message":"make chart"}}' &&
  phase=$("$KUBECTL" -n kstore get dispatchjob "$dj" -o jsonpath='{.status.phase}') &&
  [ "$phase" = Running ] &&
  as_kstore PATCH "$dj_url" '{"spec":{"delete":true}}' &&
  as_kstore DELETE "$dj_url"
} >"$CHART_OUT/dispatchjob.log" 2>&1 ||
  { cat "$CHART_OUT/dispatchjob.log"; echo "chart: DispatchJob create / status patch / delete as $kstore_sa FAILED" >&2; exit 1; }
if out=$("$KUBECTL" --as=system:serviceaccount:edge:edge-rollouts-dispatch-agent -n kstore create -f "$DJ_SAMPLE" 2>&1) ||
  ! grep -q 'Error from server (Forbidden)' <<<"$out"; then
  echo "$out" >&2; echo "chart: creating a DispatchJob as the agent's ServiceAccount was not forbidden" >&2; exit 1
fi
echo "$out" >>"$CHART_OUT/dispatchjob.log"
echo "chart: DispatchJob created, status patched, deleted as the kubernetes-store server (agent refused) in $(since "$t"); total $(since "$t0"); renderings in $CHART_OUT"

# --- the chart-generated CA and certificate survive upgrades (lookup, as helm upgrade does) ------
# Each rendering runs `lookup` against the cluster (helm template --dry-run=server) and is applied,
# as an install then two upgrades: the CA and certificate stay; new DNS names re-sign the
# certificate with the same CA; the CA ConfigMap holds that CA; the certificate verifies for the
# Service name with the CA (openssl).
t=$(date +%s)
tls_ns=tls-upgrade
"$KUBECTL" create namespace "$tls_ns" >/dev/null
tls_round() { # tls_round NAME HELM-ARGS...: render with lookup, apply, write "<tls.crt> <ca.crt>" (base64) to $CHART_OUT/tls-NAME.data
  local f="$CHART_OUT/tls-$1.yaml" data="$CHART_OUT/tls-$1.data"; shift
  "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$tls_ns" -f "$DEFAULT_VALUES" --dry-run=server \
    --show-only templates/tls.yaml "$@" >"$f" 2>"$f.log" &&
  "$KUBECTL" apply -f "$f" >>"$f.log" 2>&1 ||
    { cat "$f.log"; echo "chart: TLS upgrade check: rendering or applying $f FAILED" >&2; exit 1; }
  "$KUBECTL" -n "$tls_ns" get secret "$RELEASE-tls" -o jsonpath='{.data.tls\.crt} {.data.ca\.crt}' >"$data"
  echo >>"$data"
}
tls_round install
tls_round upgrade
tls_round dns-names --set 'tls.dnsNames={rollouts-dispatch.example.com}'
read -r crt1 ca1 <"$CHART_OUT/tls-install.data"
read -r crt2 ca2 <"$CHART_OUT/tls-upgrade.data"
read -r crt3 ca3 <"$CHART_OUT/tls-dns-names.data"
[ -n "$crt1" ] && [ -n "$ca1" ] || { echo "chart: TLS upgrade check: no certificate in Secret $RELEASE-tls" >&2; exit 1; }
[ "$crt2" = "$crt1" ] && [ "$ca2" = "$ca1" ] ||
  { echo "chart: TLS upgrade check: an upgrade replaced the generated certificate or CA (lookup not used?)" >&2; exit 1; }
[ "$ca3" = "$ca1" ] && [ "$crt3" != "$crt1" ] ||
  { echo "chart: TLS upgrade check: new tls.dnsNames must re-sign the certificate with the same CA" >&2; exit 1; }
base64 -d <<<"$ca1" >"$CHART_OUT/tls-ca.pem"
base64 -d <<<"$crt3" >"$CHART_OUT/tls-crt.pem"
[ "$("$KUBECTL" -n "$tls_ns" get configmap "$RELEASE-ca" -o jsonpath='{.data.ca\.crt}')" = "$(cat "$CHART_OUT/tls-ca.pem")" ] ||
  { echo "chart: TLS upgrade check: ConfigMap $RELEASE-ca does not hold the CA of Secret $RELEASE-tls" >&2; exit 1; }
for host in "$RELEASE.$tls_ns.svc" rollouts-dispatch.example.com; do
  openssl verify -CAfile "$CHART_OUT/tls-ca.pem" -verify_hostname "$host" "$CHART_OUT/tls-crt.pem" >>"$CHART_OUT/tls-verify.log" 2>&1 ||
    { cat "$CHART_OUT/tls-verify.log"; echo "chart: TLS upgrade check: the certificate does not verify for $host with the CA" >&2; exit 1; }
done
echo "chart: generated TLS kept across upgrades (CA and certificate unchanged; new tls.dnsNames re-signed by the same CA; verified for $RELEASE.$tls_ns.svc) in $(since "$t")"

stop_cluster
cluster_pid=""
echo "$docs_line"
echo "chart: lint=ok template=ok dry_run=ok apply=ok rbac=ok ($sars SubjectAccessReviews) variants=${#VARIANTS[@]} examples=${#EXAMPLES[@]}"
