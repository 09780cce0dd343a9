{{/*
The NVIDIA device plugin config files (version v1), one per named config in .Values.sharing.configs,
as a YAML map name -> config. The device plugin ConfigMap and the webhook policy ConfigMap both
render from this one definition, so they cannot disagree.
*/}}
{{- define "gpu-stack.devicePluginConfigs" -}}
{{- $plugin := .Values.devicePlugin }}
{{- $out := dict }}
{{- range $name, $cfg := .Values.sharing.configs }}
{{- $flags := dict "migStrategy" ($cfg.migStrategy | default "none") "failOnInitError" $plugin.failOnInitError }}
{{- $_ := set $flags "plugin" (dict "passDeviceSpecs" $plugin.passDeviceSpecs "deviceListStrategy" $plugin.deviceListStrategy "deviceIDStrategy" $plugin.deviceIDStrategy) }}
{{- $file := dict "version" "v1" "flags" $flags }}
{{- $sharing := dict }}
{{- range $mode := list "timeSlicing" "mps" }}
{{- with (get $cfg $mode) }}
{{- $section := dict "resources" .resources }}
{{- if hasKey . "renameByDefault" }}{{ $_ := set $section "renameByDefault" .renameByDefault }}{{ end }}
{{- if hasKey . "failRequestsGreaterThanOne" }}{{ $_ := set $section "failRequestsGreaterThanOne" .failRequestsGreaterThanOne }}{{ end }}
{{- $_ := set $sharing $mode $section }}
{{- end }}
{{- end }}
{{- if $sharing }}{{ $_ := set $file "sharing" $sharing }}{{ end }}
{{- $_ := set $out $name $file }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Names of the configs that share GPUs through MPS, as a YAML list. */}}
{{- define "gpu-stack.mpsConfigNames" -}}
{{- $names := list }}
{{- range $name, $cfg := .Values.sharing.configs }}
{{- if and $cfg.mps $cfg.mps.resources }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- toYaml $names }}
{{- end }}

{{/* "true" when some sharing config shares GPUs through MPS, else "". */}}
{{- define "gpu-stack.hasMps" -}}
{{- if (include "gpu-stack.mpsConfigNames" . | fromYamlArray) }}true{{ end }}
{{- end }}

{{/* "true" when some sharing config uses a MIG strategy other than none, else "". */}}
{{- define "gpu-stack.anyMig" -}}
{{- range $name, $cfg := .Values.sharing.configs }}
{{- if ne ($cfg.migStrategy | default "none") "none" }}true{{ end }}
{{- end }}
{{- end }}
