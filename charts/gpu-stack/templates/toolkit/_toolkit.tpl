{{/*
Container runtime presets of the toolkit (upstream facts, nvidia-container-toolkit
cmd/nvidia-ctk-installer and GPU Operator's transformForRuntime):
- containerd: top-level /etc/containerd/config.toml, the nvidia runtime goes to the drop-in
  /etc/containerd/conf.d/99-nvidia.toml (the toolkit adds the import), socket /run/containerd/containerd.sock.
- k3s / rke2: the agent renders containerd's config from config.toml.tmpl on start, so the toolkit
  writes the template (no drop-in) seeded from the generated config.toml (RUNTIME_CONFIG_SOURCE);
  embedded containerd listens on /run/k3s/containerd/containerd.sock.
- crio: reads /etc/crio/crio.conf, writes the drop-in /etc/crio/crio.conf.d/99-nvidia.conf,
  restarted through systemd (crio has no reload signal).
Returns a YAML map: runtime, config, dropIn, socket, configSource.
*/}}
{{- define "gpu-stack.toolkitRuntime" -}}
{{- $presets := dict
  "containerd" (dict "runtime" "containerd" "config" "/etc/containerd/config.toml" "dropIn" "/etc/containerd/conf.d/99-nvidia.toml" "socket" "/run/containerd/containerd.sock" "configSource" "")
  "k3s" (dict "runtime" "containerd" "config" "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl" "dropIn" "" "socket" "/run/k3s/containerd/containerd.sock" "configSource" "file=/var/lib/rancher/k3s/agent/etc/containerd/config.toml")
  "rke2" (dict "runtime" "containerd" "config" "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl" "dropIn" "" "socket" "/run/k3s/containerd/containerd.sock" "configSource" "file=/var/lib/rancher/rke2/agent/etc/containerd/config.toml")
  "crio" (dict "runtime" "crio" "config" "/etc/crio/crio.conf" "dropIn" "/etc/crio/crio.conf.d/99-nvidia.conf" "socket" "/var/run/crio/crio.sock" "configSource" "")
}}
{{- $t := .Values.toolkit }}
{{- $p := get $presets $t.runtime }}
{{- if not $p }}
{{- fail (printf "gpu-stack: toolkit.runtime %q is not a known preset; use one of %s (and override paths with toolkit.runtimeConfig, toolkit.runtimeDropInConfig, toolkit.runtimeSocket)" $t.runtime (keys $presets | sortAlpha | join ", ")) }}
{{- end }}
{{- $p = deepCopy $p }}
{{- with .Values.toolkit.runtimeConfig }}{{ $_ := set $p "config" . }}{{ end }}
{{- with .Values.toolkit.runtimeDropInConfig }}{{ $_ := set $p "dropIn" . }}{{ end }}
{{- with .Values.toolkit.runtimeSocket }}{{ $_ := set $p "socket" . }}{{ end }}
{{- toYaml $p }}
{{- end }}
