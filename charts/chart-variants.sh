# Sourced by chart-check.sh and chart-rbac.sh: the renderings (variants) of the chart that
# `make chart` checks. "default" is values.yaml plus charts/testdata/default-values.yaml (a policy
# rule: the one value the chart refuses to render without); every ci/<name>-values.yaml is "<name>".
# Needs CHART_DIR.
VARIANTS=(default)
for f in "$CHART_DIR"/ci/*-values.yaml; do VARIANTS+=("$(basename "$f" -values.yaml)"); done
DEFAULT_VALUES=charts/testdata/default-values.yaml
values_args() { if [ "$1" = default ]; then echo "-f $DEFAULT_VALUES"; else echo "-f $CHART_DIR/ci/$1-values.yaml"; fi; }
