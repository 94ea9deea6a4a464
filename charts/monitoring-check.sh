#!/usr/bin/env bash
# `make monitoring-check` (charts/monitoring.mk): the chart's monitoring files against Prometheus'
# own checker and the metrics catalog.
#   1. `promtool check rules` (with its linter, fatal) on monitoring/rules.yaml;
#   2. `promtool test rules` on tests/monitoring/rules_test.yaml: every alert fires on the series
#      that should fire it, with its exact labels and annotations, and stays silent otherwise;
#   3. every dashboard's panel queries (Grafana's variables given values) parse as PromQL: they are
#      written as recording rules into a temporary rule file for `promtool check rules`;
#   4. the chart renders both unchanged (`helm template` with monitoring.*.enabled): the
#      PrometheusRule's spec passes the same unit tests, the ConfigMap holds the same dashboard;
#   5. every metric name the dashboards and rules name (`rollouts_dispatch_…`, anywhere in the
#      files: queries, variables, descriptions) is a series of the catalog, docs/metrics.md, which
#      a unit test keeps equal to the registry (server/src/runtime/metrics/catalog.rs).
# Last line: `monitoring: rules=R dashboards=D metrics_named=N missing=M`; exit 1 when M > 0.
#
# Environment (set by monitoring.mk): PROMTOOL, HELM, CHART_DIR, MONITORING_DIR.
set -euo pipefail

: "${PROMTOOL:?}" "${HELM:?}" "${CHART_DIR:?}" "${MONITORING_DIR:?}"
RULES=$MONITORING_DIR/rules.yaml
TESTS=tests/monitoring/rules_test.yaml
CATALOG=docs/metrics.md
shopt -s nullglob
DASHBOARDS=("$MONITORING_DIR"/*.json)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$PROMTOOL" check rules --lint=all --lint-fatal "$RULES" >"$tmp/check.log" 2>&1 ||
  { cat "$tmp/check.log"; echo "monitoring: promtool check rules $RULES FAILED" >&2; exit 1; }
echo "monitoring: promtool check rules: $(grep -o 'SUCCESS: [0-9]* rules found' "$tmp/check.log")"

"$PROMTOOL" test rules "$TESTS" >"$tmp/test.log" 2>&1 ||
  { cat "$tmp/test.log"; echo "monitoring: promtool test rules $TESTS FAILED" >&2; exit 1; }
echo "monitoring: promtool test rules: $(grep -c '^  - name:' "$TESTS") test groups, $(grep -c 'alertname:' "$TESTS") alert evaluations pass"

queries=0
for d in "${DASHBOARDS[@]}"; do
  out="$tmp/$(basename "$d" .json).rules.json"
  jq '{groups: [{name: "panels", rules: [[.. | objects | select(has("expr")) | .expr] | to_entries[]
        | {record: "dashboard:query_\(.key)",
           expr: (.value | gsub("\\$__rate_interval"; "5m") | gsub("\\$__interval"; "1m") | gsub("\\$namespace"; ".*"))}]}]}' \
    "$d" >"$out"
  n=$(jq '.groups[0].rules | length' "$out")
  [ "$n" -gt 0 ] || { echo "monitoring: $d has no panel query" >&2; exit 1; }
  "$PROMTOOL" check rules "$out" >"$tmp/panels.log" 2>&1 ||
    { cat "$tmp/panels.log"; echo "monitoring: a panel query of $d does not parse" >&2; exit 1; }
  queries=$((queries + n))
done
echo "monitoring: ${#DASHBOARDS[@]} dashboards, $queries panel queries parse"

# The chart's renderings: the spec of the PrometheusRule is a rule file (spec.groups), unit-tested
# again; the ConfigMap's JSON is the dashboard. Defaults otherwise (no alertLabels, no runbook base).
render() { "$HELM" template rollouts-dispatch "$CHART_DIR" -f charts/testdata/default-values.yaml \
  --set monitoring.rules.enabled=true --set monitoring.dashboard.enabled=true --show-only "templates/$1"; }
render monitoring-rules.yaml | sed -n '/^spec:$/,$p' | tail -n +2 | sed 's/^  //' >"$tmp/rendered-rules.yaml"
sed "s|^  - .*/rules.yaml$|  - $tmp/rendered-rules.yaml|" "$TESTS" >"$tmp/rendered_test.yaml"
grep -qF "$tmp/rendered-rules.yaml" "$tmp/rendered_test.yaml" || { echo "monitoring: no rule_files line in $TESTS" >&2; exit 1; }
"$PROMTOOL" test rules "$tmp/rendered_test.yaml" >"$tmp/rendered.log" 2>&1 ||
  { cat "$tmp/rendered.log"; echo "monitoring: the chart's PrometheusRule fails $TESTS" >&2; exit 1; }
render monitoring-dashboard.yaml | sed -n '/^  rollouts-dispatch.json: |-$/,$p' | tail -n +2 | sed 's/^    //' >"$tmp/rendered.json"
cmp -s <(jq -S . "$tmp/rendered.json") <(jq -S . "$MONITORING_DIR/dashboard.json") ||
  { echo "monitoring: the chart's dashboard ConfigMap differs from $MONITORING_DIR/dashboard.json" >&2; exit 1; }
echo "monitoring: the chart's PrometheusRule passes the same tests, its ConfigMap holds the dashboard"

# The catalog's series: the first column of its table.
grep -oE '^\| `rollouts_dispatch_[a-z0-9_]+`(<br>`rollouts_dispatch_[a-z0-9_]+`)*' "$CATALOG" |
  grep -oE 'rollouts_dispatch_[a-z0-9_]+' | sort -u >"$tmp/catalog"
[ -s "$tmp/catalog" ] || { echo "monitoring: no series in $CATALOG" >&2; exit 1; }
cat "$RULES" "${DASHBOARDS[@]}" | grep -oE 'rollouts_dispatch_[a-z0-9_]+' | sort -u >"$tmp/named"
missing=$(comm -23 "$tmp/named" "$tmp/catalog")
for m in $missing; do echo "monitoring: $m is named by the dashboards or rules but is no series of $CATALOG" >&2; done
rules=$(grep -cE '^\s*- (alert|record):' "$RULES")
echo "monitoring: rules=$rules dashboards=${#DASHBOARDS[@]} metrics_named=$(wc -l <"$tmp/named") missing=$(grep -c . <<<"$missing" || true)"
[ -z "$missing" ]
