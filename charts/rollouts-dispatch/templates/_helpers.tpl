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

{{/* The server configuration file: .Values.config, plus an `argocd` block from argocd.* when
enabled, plus an `agents` block from agents.* when agents.destinations is non-empty. */}}
{{- define "rollouts-dispatch.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if and .Values.argocd.enabled (not (hasKey $config "argocd")) }}
{{- $_ := set $config "argocd" (dict "namespace" .Values.argocd.namespace "inCluster" .Values.inCluster.enabled "defaultNamespace" .Values.argocd.defaultNamespace) }}
{{- end }}
{{- if .Values.agents.destinations }}
{{- $_ := set $config "agents" (dict "store" .Values.agents.store "namespace" .Release.Namespace "offlineAfter" .Values.agents.offlineAfter "destinations" .Values.agents.destinations) }}
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

{{/* True ("true") when the server keeps agent jobs in DispatchJob resources (needs their RBAC). */}}
{{- define "rollouts-dispatch.kubernetesStore" -}}
{{- if and .Values.server.enabled .Values.agents.destinations (eq .Values.agents.store "kubernetes") }}true{{ end }}
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
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "rollouts-dispatch: tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if .Values.agents.destinations }}
{{- if and (gt (int .Values.server.replicas) 1) (ne .Values.agents.store "kubernetes") }}
{{- fail (printf "rollouts-dispatch: server.replicas=%v with agents.destinations needs agents.store: kubernetes (agents.store: %s keeps agent state in one replica)" .Values.server.replicas .Values.agents.store) }}
{{- end }}
{{- if not (include "rollouts-dispatch.signingKeySecret" .) }}
{{- fail "rollouts-dispatch: agents.destinations needs signingKey.value or signingKey.existingSecret (agent tokens are signed JWTs from `rollouts-dispatch token issue --destination NAME`)" }}
{{- end }}
{{- $seen := dict }}
{{- range (.Values.config | default dict).destinations | default list }}
{{- if .name }}{{ $_ := set $seen (toString .name) "config.destinations" }}{{ end }}
{{- end }}
{{- range .Values.agents.destinations }}
{{- $name := toString .name }}
{{- if hasKey $seen $name }}
{{- fail (printf "rollouts-dispatch: agents.destinations: destination %q is already in %s (names must be unique)" $name (get $seen $name)) }}
{{- end }}
{{- $_ := set $seen $name "agents.destinations" }}
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
{{- end }}
{{- end }}
