{{/*
Host path of the NVIDIA driver root every component uses: /run/nvidia/driver when the chart runs
the driver container (its rootfs, mounted there with Bidirectional propagation, as GPU Operator
v26.7.0 assets/state-driver does), else gpuNodes.driverRoot (a driver installed on the host).
*/}}
{{- define "gpu-stack.driverRoot" -}}
{{- if .Values.driver.enabled }}/run/nvidia/driver{{ else }}{{ .Values.gpuNodes.driverRoot }}{{ end }}
{{- end }}

{{/* The read-only `driver-root` mount at /driver-root (k8s-device-plugin's DRIVER_ROOT_CTR_PATH default); HostToContainer for the driver container's root, which is mounted after the pod starts. */}}
{{- define "gpu-stack.driverRootMount" -}}
- name: driver-root
  mountPath: /driver-root
  readOnly: true
  {{- if .Values.driver.enabled }}
  mountPropagation: HostToContainer
  {{- end }}
{{- end }}

{{/* The `driver-root` host path volume (DirectoryOrCreate for the driver container's root, which may not exist yet). */}}
{{- define "gpu-stack.driverRootVolume" -}}
- name: driver-root
  hostPath:
    path: {{ include "gpu-stack.driverRoot" . }}
    type: {{ ternary "DirectoryOrCreate" "Directory" .Values.driver.enabled }}
{{- end }}
