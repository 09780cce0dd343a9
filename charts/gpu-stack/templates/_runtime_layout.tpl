{{/*
Runtime layout: how GPUs reach containers, decided by the toolkit and device plugin values
together. See the chart README, "Runtime layout".

- runtime-class (default): the NVIDIA runtime is registered but NOT the node's default runtime
  (toolkit.setAsDefault=false); the device plugin passes devices as volume mounts, the toolkit reads
  them and ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers. GPU pods get
  `runtimeClassName: <toolkit.runtimeClass.name>` from the mutating webhook (GPU008).
- cdi: deviceListStrategy [cdi-cri], toolkit.cdi.enabled=true: the kubelet hands CDI device names to
  containerd (>= 1.7 with enable_cdi, set by the toolkit) or CRI-O, which inject them under runc; no
  environment variable can select a device and GPU pods need no runtime class.
- default-runtime: toolkit.setAsDefault=true, the GPU Operator's layout: every container on a GPU
  node runs under the NVIDIA runtime, so any privileged (or CAP_SYS_ADMIN) container is handed every
  GPU its image names, GPU pod or not.
*/}}

{{/* The runtime class the webhook injects into GPU pods: the NVIDIA runtime class when the toolkit
registers it as a non-default runtime and devices do not come through CDI alone, else "". */}}
{{- define "gpu-stack.gpuPodRuntimeClass" -}}
{{- $t := .Values.toolkit }}
{{- $cdiOnly := true }}
{{- range .Values.devicePlugin.deviceListStrategy }}{{ if not (hasPrefix "cdi-" .) }}{{ $cdiOnly = false }}{{ end }}{{ end }}
{{- if and $t.enabled (not $t.setAsDefault) $t.runtimeClass.create (not $cdiOnly) }}{{ $t.runtimeClass.name }}{{ end }}
{{- end }}

{{/* The layout name for NOTES and tests: runtime-class, cdi, default-runtime or preinstalled. */}}
{{- define "gpu-stack.runtimeLayout" -}}
{{- $t := .Values.toolkit }}
{{- if not $t.enabled }}preinstalled
{{- else if $t.setAsDefault }}default-runtime
{{- else if include "gpu-stack.gpuPodRuntimeClass" . }}runtime-class
{{- else }}cdi
{{- end }}
{{- end }}

{{/* A device plugin config resource name as the plugin v0.20 reads it (api/config/v1 NewResourceName):
bare names get the nvidia.com/ prefix. */}}
{{- define "gpu-stack.pluginResourceName" -}}
{{- if hasPrefix "nvidia.com/" . }}{{ . }}{{ else }}{{ printf "nvidia.com/%s" . }}{{ end }}
{{- end }}
