{{/*
Pieces of a pod spec that every component's workload uses.
*/}}

{{/*
imagePullSecrets of a pod: global ones first, then the component's, without duplicates.
Call with (dict "root" $ "secrets" .Values.x.imagePullSecrets).
*/}}
{{- define "gpu-stack.imagePullSecrets" -}}
{{- $all := list }}
{{- range (concat (.root.Values.global.imagePullSecrets | default list) (.secrets | default list)) }}
{{- $s := . }}
{{- if kindIs "string" . }}{{ $s = dict "name" . }}{{ end }}
{{- if not (has $s $all) }}{{ $all = append $all $s }}{{ end }}
{{- end }}
{{- with $all }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Scheduling of a pod spec: nodeSelector, affinity and tolerations.
Call with (dict "root" $ "nodeSelector" .Values.x.nodeSelector "affinity" .Values.x.affinity
"tolerations" .Values.x.tolerations "gpu" true "pauseLabel" "nvidia.com/gpu.deploy.device-plugin"
"extraSelector" (dict ...)).
- gpu: require a GPU node (any of .Values.gpuNodes.labels = "true") unless `affinity` is set.
- pauseLabel: also stay off nodes where the MIG manager set that label to paused-for-mig-change
  (the MIG manager pauses GPU clients this way while it repartitions the GPUs).
- tolerations: the component's when set, else .Values.gpuNodes.tolerations for GPU agents.
- provider: "device-plugin" or "dra" for the agents of one GPU provider (gpu-stack.dra.providerLabel):
  with dra.enabled, "device-plugin" agents stay off nodes labelled for DRA and "dra" agents run only
  there, so a node's GPUs have one provider (KEP-5004). validate.yaml refuses an `affinity` value for
  these agents then, since it would replace the GPU node affinity that carries the provider term.
*/}}
{{- define "gpu-stack.scheduling" -}}
{{- $root := .root }}
{{- $selector := merge (dict) (.extraSelector | default dict) (.nodeSelector | default dict) }}
{{- with $selector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if .affinity }}
affinity:
{{- toYaml .affinity | nindent 2 }}
{{- else if .gpu }}
{{- $terms := list }}
{{- range $root.Values.gpuNodes.labels }}
{{- $exprs := list (dict "key" . "operator" "In" "values" (list "true")) }}
{{- if $.pauseLabel }}
{{- $exprs = append $exprs (dict "key" $.pauseLabel "operator" "NotIn" "values" (list "false" "paused-for-mig-change")) }}
{{- end }}
{{- if and $.provider $root.Values.dra.enabled }}
{{- $exprs = append $exprs (dict "key" (include "gpu-stack.dra.providerLabel" $root) "operator" (ternary "In" "NotIn" (eq $.provider "dra")) "values" (list "dra")) }}
{{- end }}
{{- $terms = append $terms (dict "matchExpressions" $exprs) }}
{{- end }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
{{- toYaml $terms | nindent 8 }}
{{- end }}
{{- $tolerations := .tolerations }}
{{- if and (not $tolerations) .gpu }}{{ $tolerations = $root.Values.gpuNodes.tolerations }}{{ end }}
{{- with $tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* runtimeClassName line for agents that open GPUs through the NVIDIA runtime (empty value: none). */}}
{{- define "gpu-stack.agentRuntimeClass" -}}
{{- with .Values.gpuNodes.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
Checksum of the data of a ConfigMap the chart renders, for a pod annotation: the pod restarts when
the config it consumes changes, and only then (the ConfigMap's labels, which carry the chart
version, are left out). Call with (dict "root" $ "template" "nfd/configmap.yaml").
*/}}
{{- define "gpu-stack.configChecksum" -}}
{{- $cm := include (print .root.Template.BasePath "/" .template) .root | fromYaml }}
{{- toYaml (get $cm "data" | default dict) | sha256sum }}
{{- end }}
