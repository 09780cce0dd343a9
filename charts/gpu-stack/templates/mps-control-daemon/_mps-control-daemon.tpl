{{/* "true" when the MPS control daemon is rendered. */}}
{{- define "gpu-stack.mpsDaemonEnabled" -}}
{{- if and (include "gpu-stack.hasMps" .) .Values.mpsControlDaemon.enabled .Values.devicePlugin.enabled }}true{{ end }}
{{- end }}
