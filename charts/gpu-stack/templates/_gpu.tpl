{{/*
Shared helpers of the GPU components (NFD, toolkit, device plugin, GFD, MPS control daemon,
MIG manager, DCGM exporter). The device plugin config files themselves come from
"gpu-stack.devicePluginConfigs" in _sharing.tpl.
*/}}

{{/* Name of the ConfigMap with one device plugin config file per sharing config (contract with the chart tests). */}}
{{- define "gpu-stack.devicePluginConfigMapName" -}}
{{- include "gpu-stack.componentName" (dict "root" . "component" "device-plugin-configs") }}
{{- end }}

{{/* ServiceAccount shared by the device plugin, GFD and MPS control daemon (config-manager reads node labels). */}}
{{- define "gpu-stack.devicePluginServiceAccountName" -}}
{{- include "gpu-stack.componentName" (dict "root" . "component" "device-plugin") }}
{{- end }}

{{/* "true" when some sharing config shares GPUs through MPS, else "". */}}
{{- define "gpu-stack.hasMps" -}}
{{- if (include "gpu-stack.mpsConfigNames" . | fromYamlArray) }}true{{ end }}
{{- end }}

{{/* "true" when the MPS control daemon is rendered. */}}
{{- define "gpu-stack.mpsDaemonEnabled" -}}
{{- if and (include "gpu-stack.hasMps" .) .Values.mpsControlDaemon.enabled .Values.devicePlugin.enabled }}true{{ end }}
{{- end }}

{{/* "true" when some sharing config uses a MIG strategy other than none, else "". */}}
{{- define "gpu-stack.anyMig" -}}
{{- range $name, $cfg := .Values.sharing.configs }}
{{- if ne ($cfg.migStrategy | default "none") "none" }}true{{ end }}
{{- end }}
{{- end }}

{{/* "true" when devicePlugin.deviceListStrategy has a CDI strategy. */}}
{{- define "gpu-stack.cdiStrategy" -}}
{{- range .Values.devicePlugin.deviceListStrategy }}
{{- if hasPrefix "cdi-" . }}true{{ end }}
{{- end }}
{{- end }}

{{/*
Checksum of the device plugin config files: a pod annotation, so a changed config rolls the
device plugin, GFD and MPS daemon pods (the config-manager only re-reads on label changes).
*/}}
{{- define "gpu-stack.devicePluginConfigChecksum" -}}
{{- include "gpu-stack.devicePluginConfigs" . | sha256sum }}
{{- end }}

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
The config-manager container (device plugin image, `config-manager` binary): it copies the config
file named by the node label nvidia.com/device-plugin.config (else DEFAULT_CONFIG) from the
ConfigMap mounted at /available-configs to /config/config.yaml, and as a sidecar signals the main
process with SIGHUP when the label changes.
Call with (dict "root" $ "name" "x" "oneshot" true|false "process" "binary-to-signal").
*/}}
{{- define "gpu-stack.configManagerContainer" -}}
{{- $root := .root -}}
- name: {{ .name }}
  image: {{ include "gpu-stack.image" $root.Values.devicePlugin.image }}
  imagePullPolicy: {{ $root.Values.devicePlugin.image.pullPolicy }}
  command: ["config-manager"]
  env:
    - name: ONESHOT
      value: {{ .oneshot | quote }}
    - name: KUBECONFIG
      value: ""
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: NODE_LABEL
      value: nvidia.com/device-plugin.config
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ $root.Values.sharing.defaultConfig | quote }}
    - name: FALLBACK_STRATEGIES
      value: named,single
    - name: SEND_SIGNAL
      value: {{ not .oneshot | quote }}
    - name: SIGNAL
      value: {{ ternary "" "1" .oneshot | quote }}
    - name: PROCESS_TO_SIGNAL
      value: {{ ternary "" .process .oneshot | quote }}
  {{- with $root.Values.devicePlugin.configManagerResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
{{- end }}

{{/* The two config volumes of the config-manager arrangement. */}}
{{- define "gpu-stack.configManagerVolumes" -}}
- name: available-configs
  configMap:
    name: {{ include "gpu-stack.devicePluginConfigMapName" . }}
- name: config
  emptyDir: {}
{{- end }}

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
