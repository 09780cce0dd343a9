{{/*
The NVIDIA DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu), GPU kubelet plugin only, as
GPU Operator v26.7.0 deploys it (manifests/state-dra-driver, golden render
internal/state/testdata/golden/gpucluster-dra-driver-gpus-only.yaml) and as the driver's own chart
renders it (deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml). Not deployed: the
ComputeDomain kubelet plugin and controller (Multi-Node NVLink), the driver's webhook, and the
PassthroughSupport (vfio) host mounts.
*/}}

{{/* Node label choosing a GPU node's provider: gpu-stack.io/gpu-provider=dra runs the DRA kubelet plugin there, and no device plugin, GFD or MPS daemon. */}}
{{- define "gpu-stack.dra.providerLabel" -}}
gpu-stack.io/gpu-provider
{{- end }}

{{/* Name of the kubelet plugin's objects (DaemonSet, ServiceAccount, RBAC). */}}
{{- define "gpu-stack.dra.kubeletPluginName" -}}
{{- include "gpu-stack.componentName" (dict "root" . "component" "dra-kubelet-plugin") }}
{{- end }}

{{/* The driver name the kubelet plugin registers and publishes ResourceSlices under (cmd/gpu-kubelet-plugin/main.go DriverName). */}}
{{- define "gpu-stack.dra.driverName" -}}
gpu.nvidia.com
{{- end }}

{{/* FEATURE_GATES of the driver: Name=bool pairs, sorted, comma-separated (pkg/flags/featuregates.go). */}}
{{- define "gpu-stack.dra.featureGates" -}}
{{- $pairs := list }}
{{- range $k := keys .Values.dra.featureGates | sortAlpha }}
{{- $pairs = append $pairs (printf "%s=%t" $k (get $.Values.dra.featureGates $k)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* "true" when the driver runs MPS control daemons for MPS claims (feature gate MPSSupport). */}}
{{- define "gpu-stack.dra.mps" -}}
{{- if get .Values.dra.featureGates "MPSSupport" }}true{{ end }}
{{- end }}

{{/* The GPU sharing strategies the webhook lets claims ask for (GPU009), as a JSON list: those in
webhook.policy.dra.sharingStrategies, plus those the chart's DRA driver runs with (dra.enabled and its
feature gate: MPSSupport gives MPS, TimeSlicingSettings gives TimeSlicing; featuregates.go of the driver). */}}
{{- define "gpu-stack.dra.sharingStrategies" -}}
{{- $strategies := .Values.webhook.policy.dra.sharingStrategies | default list }}
{{- if .Values.dra.enabled }}
{{- if get .Values.dra.featureGates "MPSSupport" }}{{ $strategies = append $strategies "MPS" }}{{ end }}
{{- if get .Values.dra.featureGates "TimeSlicingSettings" }}{{ $strategies = append $strategies "TimeSlicing" }}{{ end }}
{{- end }}
{{- $strategies | uniq | sortAlpha | toJson }}
{{- end }}
