#!/usr/bin/env bash
# The RBAC golden test of the chart: every grant (subject, scope, resource, verb) of every rendering
# `make chart` checks (charts/chart-variants.sh) against charts/rbac-allowlist.txt, by the Rust
# checker tests/src/bin/chart-rbac.rs (its `//!` says what fails: any grant not listed, any listed
# grant no longer rendered, wildcards, bindings to roles the chart does not render).
#
#   chart-rbac.sh check DIR   (chart-check.sh) check the renderings DIR/<variant>.yaml already made
#   chart-rbac.sh check       `make chart-rbac`: render every variant into a temp dir, then check
#   chart-rbac.sh write       `make chart-rbac-allowlist`: render, then rewrite the allowlist: a
#                             deliberate update, reviewed as a diff
#
# Environment (set by chart.mk): HELM, CARGO, CHART_DIR.
set -euo pipefail

: "${HELM:?}" "${CARGO:?}" "${CHART_DIR:?}"
mode=${1:-}
case $mode in check | write) ;; *) echo "usage: $0 check [DIR] | write" >&2; exit 2 ;; esac
ALLOWLIST=charts/rbac-allowlist.txt
RELEASE=rollouts-dispatch
NAMESPACE=rollouts-dispatch
# shellcheck source=charts/chart-variants.sh
source charts/chart-variants.sh

dir=${2:-}
if [ -z "$dir" ]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  for v in "${VARIANTS[@]}"; do
    # shellcheck disable=SC2046
    "$HELM" template "$RELEASE" "$CHART_DIR" --namespace "$NAMESPACE" $(values_args "$v") >"$dir/$v.yaml" ||
      { echo "chart-rbac: helm template ($v values) FAILED" >&2; exit 1; }
  done
fi
nice -n 10 "$CARGO" build -q -p dispatch-tests --bin chart-rbac
target_dir=$("$CARGO" metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
args=()
for v in "${VARIANTS[@]}"; do args+=("$v=$dir/$v.yaml"); done
"$target_dir/debug/chart-rbac" "$mode" --allowlist "$ALLOWLIST" "${args[@]}"
