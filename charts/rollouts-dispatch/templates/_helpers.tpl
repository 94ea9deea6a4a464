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

{{/* The server configuration file: .Values.config, plus an `argocd` block from argocd.* when enabled. */}}
{{- define "rollouts-dispatch.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if and .Values.argocd.enabled (not (hasKey $config "argocd")) }}
{{- $_ := set $config "argocd" (dict "namespace" .Values.argocd.namespace "inCluster" .Values.inCluster.enabled "defaultNamespace" .Values.argocd.defaultNamespace) }}
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
