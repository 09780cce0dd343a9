{{/*
The device plugin's config arrangement, shared with GFD and the MPS control daemon (same image,
ServiceAccount and config-manager). The config files themselves come from
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
    # Needs no GPU: without this the image's NVIDIA_VISIBLE_DEVICES=all would make the NVIDIA
    # runtime inject the driver, which cannot write into a read-only root filesystem.
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  {{- with $root.Values.devicePlugin.configManagerResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if not .oneshot }}
  {{- /* Alive and ready while the selected config file is in place (config-manager keeps the
  /config/config.yaml symlink pointing into /available-configs; a dangling link fails `test -e`). */}}
  livenessProbe:
    exec:
      command: ["sh", "-c", "test -e /config/config.yaml"]
    periodSeconds: 30
    timeoutSeconds: 5
    failureThreshold: 4
  readinessProbe:
    exec:
      command: ["sh", "-c", "test -e /config/config.yaml"]
    periodSeconds: 10
    timeoutSeconds: 5
  {{- end }}
  {{- /* The sidecar SIGHUPs the root main process, which only root may do; the init container runs as 65532. */}}
  {{- include "gpu-stack.security.restrictedContainer" (dict "uid" (ternary 65532 0 .oneshot)) | nindent 2 }}
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
    {{- include "gpu-stack.security.apiTokenMount" . | nindent 4 }}
{{- end }}

{{/* The two config volumes of the config-manager arrangement. */}}
{{- define "gpu-stack.configManagerVolumes" -}}
- name: available-configs
  configMap:
    name: {{ include "gpu-stack.devicePluginConfigMapName" . }}
- name: config
  emptyDir: {}
{{ include "gpu-stack.security.apiTokenVolume" . }}
{{- end }}
