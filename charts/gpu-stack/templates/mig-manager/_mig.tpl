{{- /*
MIG manager contract helpers (NVIDIA/mig-parted v0.15.0 pkg/mig/reconfigure/reconfigure.go):
before it repartitions, the MIG manager sets nvidia.com/gpu.deploy.<component> to
paused-for-mig-change on its node, then polls pods on its node in DEFAULT_GPU_CLIENTS_NAMESPACE
with these hard-coded app= labels until none is left; afterwards it sets the labels back to "true"
(a label a user set to "false" stays "false").
*/ -}}

{{/* Node label through which GPU Operator-style tooling (the MIG manager, users) stops a component on a node. Call with the component ("device-plugin"). */}}
{{- define "gpu-stack.deployLabel" -}}
nvidia.com/gpu.deploy.{{ . }}
{{- end }}

{{/*
The `app` pod label the MIG manager selects a GPU client by (empty for components it does not
select). Call with the component name of gpu-stack.labels.
*/}}
{{- define "gpu-stack.migClientAppLabel" -}}
{{- $apps := dict
  "device-plugin" "nvidia-device-plugin-daemonset"
  "gpu-feature-discovery" "gpu-feature-discovery"
  "dcgm-exporter" "nvidia-dcgm-exporter" }}
{{- with get $apps . }}app: {{ . }}{{ end }}
{{- end }}

{{/*
Render-time check: a component affinity replaces the chart's GPU node affinity, and with it the
nvidia.com/gpu.deploy.<component> term; the MIG manager would then wait 5 minutes for a pod that
never leaves and give up with the GPUs still held. Call with (dict "root" $ "key" "devicePlugin"
"affinity" .Values.devicePlugin.affinity "deploy" "device-plugin").
*/}}
{{- define "gpu-stack.checkPausableAffinity" -}}
{{- $label := include "gpu-stack.deployLabel" .deploy }}
{{- if and .root.Values.migManager.enabled .affinity (not (contains $label (toJson .affinity))) }}
{{- fail (printf "gpu-stack: %s.affinity replaces the chart's GPU node affinity, so the MIG manager (migManager.enabled=true) could not stop this component before it repartitions the GPUs; add the term {key: %s, operator: NotIn, values: [\"false\", \"paused-for-mig-change\"]} to every nodeSelectorTerm of %s.affinity" .key $label .key) }}
{{- end }}
{{- end }}
