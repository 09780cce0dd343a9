{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "gpu-stack.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, or release-chart when they differ. */}}
{{- define "gpu-stack.fullname" -}}
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

{{/* Name of one component's objects: <fullname>-<component>. Call with (dict "root" $ "component" "x"). */}}
{{- define "gpu-stack.componentName" -}}
{{- printf "%s-%s" (include "gpu-stack.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-stack.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. Call with (dict "root" $ "component" "x"). */}}
{{- define "gpu-stack.labels" -}}
helm.sh/chart: {{ include "gpu-stack.chart" .root }}
{{ include "gpu-stack.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpu-stack
{{- end }}

{{/*
Labels of a pod template: the common labels without helm.sh/chart and app.kubernetes.io/version,
which change with every chart release and would restart every node agent on each upgrade.
Call with (dict "root" $ "component" "x").
*/}}
{{- define "gpu-stack.podLabels" -}}
{{ include "gpu-stack.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpu-stack
{{- end }}

{{/* Selector labels. Call with (dict "root" $ "component" "x"). */}}
{{- define "gpu-stack.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-stack.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* image reference "repository:tag". Call with an image values map. */}}
{{- define "gpu-stack.image" -}}
{{- printf "%s:%s" .repository .tag }}
{{- end }}

{{/* ClusterRole (and optional ClusterRoleBinding) of `kubectl gpu-stack inspect`. */}}
{{- define "gpu-stack.inspectClusterRoleName" -}}
{{- include "gpu-stack.componentName" (dict "root" . "component" "inspect") }}
{{- end }}

{{/* Where `kubectl gpu-stack inspect` looks for the dashboards (and its Role lives): monitoring.dashboards.namespace
when the dashboards are on and it is set, else the release namespace. */}}
{{- define "gpu-stack.inspectDashboardsNamespace" -}}
{{- $d := .Values.monitoring.dashboards }}
{{- if and $d.enabled $d.namespace }}{{ $d.namespace }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}
