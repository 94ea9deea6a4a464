{{/* Chart name, truncated to 63 characters (DNS label). */}}
{{- define "rollouts-dispatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release name, plus the chart name unless the release name contains it. */}}
{{- define "rollouts-dispatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rollouts-dispatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "rollouts-dispatch.labels" -}}
helm.sh/chart: {{ include "rollouts-dispatch.chart" . }}
{{ include "rollouts-dispatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels (name + instance); callers add app.kubernetes.io/component. */}}
{{- define "rollouts-dispatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rollouts-dispatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rollouts-dispatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rollouts-dispatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rollouts-dispatch.agentServiceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (printf "%s-agent" (include "rollouts-dispatch.fullname" .)) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rollouts-dispatch.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret with the JWT signing key, or "" when there is none. */}}
{{- define "rollouts-dispatch.signingKeySecret" -}}
{{- if .Values.signingKey.existingSecret }}
{{- .Values.signingKey.existingSecret }}
{{- else if .Values.signingKey.value }}
{{- printf "%s-signing-key" (include "rollouts-dispatch.fullname" .) }}
{{- end }}
{{- end }}

{{/* "true" when the server confirms runs: `confirmRuns` of config when it has one (it wins),
else server.confirmRuns. Decides the config's `controlPlane: {}` and the analysisruns grant. */}}
{{- define "rollouts-dispatch.confirmRuns" -}}
{{- $config := .Values.config | default dict }}
{{- if hasKey $config "confirmRuns" }}{{ if $config.confirmRuns }}true{{ end }}
{{- else if .Values.server.confirmRuns }}true
{{- end }}
{{- end }}

{{/* The server's agent destinations (JSON): config.agents when config has one (as written,
`namespace` defaulting to the release namespace), else agents.* when agents.destinations is
non-empty, else {}. Both at once fail (templates/validate.yaml). Decides the `agents` block of the
config, the DispatchJob RBAC, the checks and the NOTES. */}}
{{- define "rollouts-dispatch.agents" -}}
{{- $config := .Values.config | default dict }}
{{- if hasKey $config "agents" }}
{{- $agents := deepCopy ($config.agents | default dict) }}
{{- if not (hasKey $agents "namespace") }}{{ $_ := set $agents "namespace" .Release.Namespace }}{{ end }}
{{- if not (hasKey $agents "store") }}{{ $_ := set $agents "store" "memory" }}{{ end }}
{{- toJson $agents }}
{{- else if .Values.agents.destinations }}
{{- toJson (dict "store" .Values.agents.store "namespace" .Release.Namespace "offlineAfter" .Values.agents.offlineAfter "destinations" .Values.agents.destinations) }}
{{- else }}{}
{{- end }}
{{- end }}

{{/* The server configuration file: .Values.config, plus an `argocd` block from argocd.* (and
inCluster.namespaces as its inClusterNamespaces) when enabled, plus an `agents` block from
agents.* when agents.destinations is non-empty, plus `confirmRuns` and `ui` from server.confirmRuns
and ui.*; a key config sets itself wins. */}}
{{- define "rollouts-dispatch.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if and .Values.argocd.enabled (not (hasKey $config "argocd")) }}
{{- $argocd := dict "namespace" .Values.argocd.namespace "inCluster" .Values.inCluster.enabled "defaultNamespace" .Values.argocd.defaultNamespace }}
{{- if and .Values.inCluster.enabled .Values.inCluster.namespaces }}
{{- /* The in-cluster destination is limited to the namespaces its Roles cover: its caches watch
each of them, and a placement elsewhere is refused (server/src/destinations/argocd.rs, in_cluster_spec). */}}
{{- $_ := set $argocd "inClusterNamespaces" .Values.inCluster.namespaces }}
{{- end }}
{{- $_ := set $config "argocd" $argocd }}
{{- end }}
{{- if include "rollouts-dispatch.confirmRuns" . }}
{{- if not (hasKey $config "controlPlane") }}
{{- $_ := set $config "controlPlane" dict }}
{{- end }}
{{- end }}
{{- if not (hasKey $config "confirmRuns") }}
{{- $_ := set $config "confirmRuns" (.Values.server.confirmRuns | default false) }}
{{- end }}
{{- if not (hasKey $config "ui") }}
{{- if .Values.ui.enabled }}
{{- $ui := dict }}
{{- with .Values.ui.externalURL }}
{{- $_ := set $ui "externalURL" . }}
{{- end }}
{{- if .Values.ui.proxy.trustedAddresses }}
{{- $proxy := dict "trustedAddresses" .Values.ui.proxy.trustedAddresses "userHeader" .Values.ui.proxy.userHeader "groupsHeader" .Values.ui.proxy.groupsHeader }}
{{- $_ := set $ui "people" (dict "proxy" $proxy) }}
{{- end }}
{{- if $ui }}
{{- $_ := set $config "ui" $ui }}
{{- end }}
{{- else }}
{{- /* Without ui.enabled the server has no grant for TokenReviews of people: it accepts none. */}}
{{- $_ := set $config "ui" (dict "people" (dict "tokenReview" false)) }}
{{- end }}
{{- end }}
{{- $agents := include "rollouts-dispatch.agents" . | fromJson }}
{{- if $agents }}
{{- $_ := set $config "agents" $agents }}
{{- end }}
{{- if $config }}
{{- toYaml $config }}
{{- else }}
{{- "{}" }}
{{- end }}
{{- end }}

{{/* API URL for the plugin's --server. */}}
{{- define "rollouts-dispatch.apiURL" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" .Values.tls.enabled) (include "rollouts-dispatch.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}

{{/* How the server gets its certificate (tls.enabled): "secret" (tls.secretName), "certManager"
(tls.certManager.issuerRef.name) or "generated" (templates/tls.yaml makes a CA and a certificate). */}}
{{- define "rollouts-dispatch.tlsMode" -}}
{{- if .Values.tls.secretName }}secret
{{- else if (.Values.tls.certManager.issuerRef | default dict).name }}certManager
{{- else }}generated
{{- end }}
{{- end }}

{{/* The kubernetes.io/tls Secret the server mounts. */}}
{{- define "rollouts-dispatch.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "rollouts-dispatch.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/* DNS names of the server certificate (JSON list): the Service's names, then tls.dnsNames. */}}
{{- define "rollouts-dispatch.tlsDNSNames" -}}
{{- $svc := include "rollouts-dispatch.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- concat $names .Values.tls.dnsNames | uniq | toJson }}
{{- end }}

{{/* True ("true") when this release publishes the CA ConfigMap <fullname>-ca: the chart generated
the CA, or tls.caBundle gives it. */}}
{{- define "rollouts-dispatch.caConfigMap" -}}
{{- if and .Values.server.enabled .Values.tls.enabled (or (eq (include "rollouts-dispatch.tlsMode" .) "generated") .Values.tls.caBundle) }}true{{ end }}
{{- end }}

{{/* The CA the agent pins (`--ca-file`): a volume source (YAML) of agent.caSecret, else
agent.caConfigMap, else this release's CA ConfigMap; "" when none. */}}
{{- define "rollouts-dispatch.agentCAVolume" -}}
{{- if .Values.agent.caSecret.name }}
secret:
  secretName: {{ .Values.agent.caSecret.name }}
  defaultMode: 0444
  items:
    - key: {{ .Values.agent.caSecret.key }}
      path: ca.crt
{{- else if .Values.agent.caConfigMap.name }}
configMap:
  name: {{ .Values.agent.caConfigMap.name }}
  defaultMode: 0444
  items:
    - key: {{ .Values.agent.caConfigMap.key }}
      path: ca.crt
{{- else if include "rollouts-dispatch.caConfigMap" . }}
configMap:
  name: {{ include "rollouts-dispatch.fullname" . }}-ca
  defaultMode: 0444
  items:
    - key: ca.crt
      path: ca.crt
{{- end }}
{{- end }}

{{/* True ("true") when the server keeps agent jobs in DispatchJob resources (needs their RBAC). */}}
{{- define "rollouts-dispatch.kubernetesStore" -}}
{{- $agents := include "rollouts-dispatch.agents" . | fromJson }}
{{- if and .Values.server.enabled $agents.destinations (eq (toString $agents.store) "kubernetes") }}true{{ end }}
{{- end }}

{{/* True ("true") when the replicas share agents' log requests (agents.store: kubernetes): each
publishes its requests with its pod IP (POD_IP) and forwards an agent's upload to the replica
holding the reader, over TLS verified against the Service name with the CA of the release's CA
ConfigMap (or in plain HTTP with tls.enabled false). Off with TLS but no CA the chart knows
(cert-manager or tls.secretName without tls.caBundle): a reader then gets a Job's log only from
the replica its agent polls. */}}
{{- define "rollouts-dispatch.logPeers" -}}
{{- if and (include "rollouts-dispatch.kubernetesStore" .) (or (not .Values.tls.enabled) (include "rollouts-dispatch.caConfigMap" .)) }}true{{ end }}
{{- end }}

{{/* Checks across values that values.schema.json cannot express with a clear message; included by
templates/validate.yaml. Renders nothing. */}}
{{- define "rollouts-dispatch.validate" -}}
{{- if not (or .Values.server.enabled .Values.agent.enabled) }}
{{- fail "rollouts-dispatch: nothing to install: set server.enabled (control plane) and/or agent.enabled (destination cluster)" }}
{{- end }}
{{- if .Values.server.enabled }}
{{- if and (not (include "rollouts-dispatch.signingKeySecret" .)) (empty .Values.server.tokenReviewAllow) }}
{{- fail "rollouts-dispatch: the server refuses to start without authentication: set signingKey.value, signingKey.existingSecret and/or server.tokenReviewAllow" }}
{{- end }}
{{- $policy := (.Values.config | default dict).policy | default dict }}
{{- /* Callers fail closed (#27): a TokenReview identity no policy.callers entry matches acts for
no project, and the server refuses to start with one; the entry's subject is a glob (`*`, `?`). */}}
{{- range .Values.server.tokenReviewAllow }}
{{- $user := toString . }}
{{- $bound := false }}
{{- range $policy.callers | default list }}
{{- $glob := regexQuoteMeta (toString .subject) | replace "\\*" ".*" | replace "\\?" "." }}
{{- if regexMatch (printf "^%s$" $glob) $user }}{{ $bound = true }}{{ end }}
{{- end }}
{{- if not $bound }}
{{- fail (printf "rollouts-dispatch: server.tokenReviewAllow %s matches no config.policy.callers entry, so it could act for no Kargo project (callers fail closed; the server refuses to start): add {subject: %q, projects: [\"*\"]} for the Argo Rollouts controller, which serves every namespace, or the projects it serves" $user $user) }}
{{- end }}
{{- end }}
{{- if not (or $policy.rules $policy.allowAll) }}
{{- fail "rollouts-dispatch: deny by default: with no policy the server dispatches nothing. Set config.policy.rules, e.g. [{projects: [team-a], destinations: [in-cluster], namespaces: [verification]}], or config.policy.allowAll: true to let every project use every destination and namespace" }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.secretName (.Values.tls.certManager.issuerRef | default dict).name }}
{{- fail "rollouts-dispatch: tls.secretName and tls.certManager.issuerRef.name are both set: use an existing Secret or a cert-manager Certificate, not both" }}
{{- end }}
{{- if .Values.inCluster.enabled }}
{{- if and (not .Values.inCluster.namespaces) (not .Values.inCluster.allowClusterWide) }}
{{- fail "rollouts-dispatch: inCluster.enabled needs inCluster.namespaces (a Role in each namespace where the server may create Jobs), or inCluster.allowClusterWide: true for a ClusterRole over every namespace" }}
{{- end }}
{{- if and .Values.inCluster.namespaces .Values.inCluster.allowClusterWide }}
{{- fail "rollouts-dispatch: inCluster.namespaces and inCluster.allowClusterWide are both set: keep one (namespaces: Roles there; allowClusterWide: every namespace)" }}
{{- end }}
{{- /* The `in-cluster` destination is Argo CD's implicit one (server config argocd[].inCluster,
written from argocd.* above): without it the Roles are made but no measurement can name
`in-cluster` (found by the real install of `make e2e-real`: "unknown destination"). */}}
{{- if and (not .Values.argocd.enabled) (not (hasKey (.Values.config | default dict) "argocd")) }}
{{- fail "rollouts-dispatch: inCluster.enabled needs argocd.enabled: true (or an `argocd` key in config): the server's `in-cluster` destination is Argo CD's implicit one (`argocd[].inCluster` in server.yaml), so without it no measurement can name `in-cluster`" }}
{{- end }}
{{- end }}
{{- $config := .Values.config | default dict }}
{{- if and (hasKey $config "agents") .Values.agents.destinations }}
{{- fail "rollouts-dispatch: config.agents and agents.destinations are both set: give the agent destinations in one place (agents.* writes the config's `agents` block)" }}
{{- end }}
{{- $agents := include "rollouts-dispatch.agents" . | fromJson }}
{{- $from := ternary "config.agents" "agents" (hasKey $config "agents") }}
{{- if and (hasKey $config "agents") (ne (toString $agents.namespace) .Release.Namespace) }}
{{- fail (printf "rollouts-dispatch: config.agents.namespace %s is not the release namespace %s: the chart grants the server its DispatchJob Role in the release namespace; remove config.agents.namespace or install the release in %s" (toString $agents.namespace) .Release.Namespace (toString $agents.namespace)) }}
{{- end }}
{{- if $agents.destinations }}
{{- if and (gt (int .Values.server.replicas) 1) (ne (toString $agents.store) "kubernetes") }}
{{- fail (printf "rollouts-dispatch: server.replicas=%v with %s.destinations needs %s.store: kubernetes (%s.store: %s keeps agent state in one replica)" .Values.server.replicas $from $from $from (toString $agents.store)) }}
{{- end }}
{{- if not (include "rollouts-dispatch.signingKeySecret" .) }}
{{- fail (printf "rollouts-dispatch: %s.destinations needs signingKey.value or signingKey.existingSecret (agent tokens are signed JWTs from `rollouts-dispatch token issue --destination NAME`)" $from) }}
{{- end }}
{{- $seen := dict }}
{{- range $config.destinations | default list }}
{{- if .name }}{{ $_ := set $seen (toString .name) "config.destinations" }}{{ end }}
{{- end }}
{{- range $agents.destinations }}
{{- $name := toString .name }}
{{- if hasKey $seen $name }}
{{- fail (printf "rollouts-dispatch: %s.destinations: destination %q is already in %s (names must be unique)" $from $name (get $seen $name)) }}
{{- end }}
{{- $_ := set $seen $name (printf "%s.destinations" $from) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.agent.enabled }}
{{- if not .Values.agent.server }}
{{- fail "rollouts-dispatch: agent.enabled needs agent.server (the URL of the rollouts-dispatch server the agent dials)" }}
{{- end }}
{{- if not .Values.agent.tokenSecret.name }}
{{- fail "rollouts-dispatch: agent.enabled needs agent.tokenSecret.name (a Secret with the token from `rollouts-dispatch token issue --destination NAME`)" }}
{{- end }}
{{- if not .Values.agent.workKeys }}
{{- fail "rollouts-dispatch: agent.enabled needs agent.workKeys (the lines `rollouts-dispatch work-keys` prints with the server's key flags: the agent runs only work the server signed)" }}
{{- end }}
{{- if hasPrefix "http://" .Values.agent.server }}
{{- $host := regexReplaceAll "^http://(\\[[^\\]]*\\]|[^/:]*).*$" .Values.agent.server "${1}" }}
{{- if not (or (eq $host "localhost") (hasPrefix "127." $host) (eq $host "[::1]")) }}
{{- fail (printf "rollouts-dispatch: agent.server %s is plain http:// to a host that is not loopback, which the agent refuses: use https:// (the server has TLS by default)" .Values.agent.server) }}
{{- end }}
{{- end }}
{{- if and (not .Values.agent.namespaces) (not .Values.agent.allowClusterWide) }}
{{- fail "rollouts-dispatch: agent.enabled needs agent.namespaces (the namespaces where the agent may create Jobs: a Role in each), or agent.allowClusterWide: true for a ClusterRole over every namespace" }}
{{- end }}
{{- if and .Values.agent.namespaces .Values.agent.allowClusterWide }}
{{- fail "rollouts-dispatch: agent.namespaces and agent.allowClusterWide are both set: keep one (namespaces: Roles there; allowClusterWide: every namespace)" }}
{{- end }}
{{- end }}
{{- end }}
