{{- /*
Bring-up order on a GPU node, as GPU Operator v26.7.0 runs it (its DaemonSets' `toolkit-validation`
init containers wait for /run/nvidia/validations/toolkit-ready, the toolkit's for driver-ready):

  1. driver (driver.enabled): its pod writes /run/nvidia/validations/driver-ready once nvidia-smi works;
  2. container toolkit (toolkit.enabled): waits for driver-ready, then its `toolkit-ready` container
     writes /run/nvidia/validations/toolkit-ready once the runtime config names the installed
     nvidia-container-runtime (and removes it when the config is reverted or the pod stops);
  3. device plugin, GFD, DCGM exporter, MPS daemon, MIG manager: a `toolkit-validation` init container
     waits for every marker of the components this chart runs.

The markers live in the node's /run (tmpfs), so a reboot clears them and the order starts again.
*/ -}}

{{/* Host directory of the bring-up markers. */}}
{{- define "gpu-stack.validationsDir" -}}
/run/nvidia/validations
{{- end }}

{{/* Markers a GPU agent waits for (YAML list): driver-ready when the chart runs the driver, toolkit-ready when it runs the toolkit. */}}
{{- define "gpu-stack.agentReadyMarkers" -}}
{{- $m := list }}
{{- if .Values.driver.enabled }}{{ $m = append $m "driver-ready" }}{{ end }}
{{- if .Values.toolkit.enabled }}{{ $m = append $m "toolkit-ready" }}{{ end }}
{{- toYaml $m }}
{{- end }}

{{/*
An init container that waits until every marker exists. Call with
(dict "root" $ "name" "toolkit-validation" "markers" (list "toolkit-ready")).
*/}}
{{- define "gpu-stack.waitForMarkersContainer" -}}
{{- $dir := include "gpu-stack.validationsDir" .root }}
- name: {{ .name }}
  image: {{ include "gpu-stack.image" .root.Values.toolkit.image }}
  imagePullPolicy: {{ .root.Values.toolkit.image.pullPolicy }}
  command: ["sh", "-c"]
  args:
    - |
      for marker in {{ join " " .markers }}; do
        until [ -f {{ $dir }}/$marker ]; do
          echo "waiting for {{ $dir }}/$marker (gpu-stack bring-up: driver -> toolkit -> GPU agents)"
          sleep 5
        done
        echo "{{ $dir }}/$marker is there"
      done
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  {{- with .root.Values.gpuNodes.helperResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- /* Only reads the root-owned markers (0644 in a 0755 directory). */}}
  {{- include "gpu-stack.security.restrictedContainer" (dict) | nindent 2 }}
  volumeMounts:
    - name: run-nvidia-validations
      mountPath: {{ $dir }}
      readOnly: true
      mountPropagation: HostToContainer
{{- end }}

{{/* The `toolkit-validation` init container of a GPU agent; empty when the chart runs neither driver nor toolkit. */}}
{{- define "gpu-stack.agentReadyInitContainer" -}}
{{- $markers := include "gpu-stack.agentReadyMarkers" . | fromYamlArray }}
{{- if $markers }}
{{- include "gpu-stack.waitForMarkersContainer" (dict "root" . "name" "toolkit-validation" "markers" $markers) }}
{{- end }}
{{- end }}

{{/* The marker volume of a pod that waits for or writes markers; empty when there is nothing to wait for. */}}
{{- define "gpu-stack.validationsVolume" -}}
{{- if or .Values.driver.enabled .Values.toolkit.enabled }}
- name: run-nvidia-validations
  hostPath:
    path: {{ include "gpu-stack.validationsDir" . }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}

{{/*
The `toolkit-ready` container of the toolkit pod: writes the toolkit-ready marker while the runtime
config (the drop-in, else the top-level file the installer edits) names the installed
nvidia-container-runtime, removes it when the installer has reverted the config or the pod stops.
Its readiness is the marker's, so the toolkit pod is Ready only once the runtime is configured.
Call with (dict "root" $ "config" "/runtime/config-dir.d/99-nvidia.toml").
*/}}
{{- define "gpu-stack.toolkitReadyContainer" -}}
{{- $root := .root }}
{{- $marker := printf "%s/toolkit-ready" (include "gpu-stack.validationsDir" $root) }}
{{- $runtime := printf "%s/toolkit/nvidia-container-runtime" $root.Values.toolkit.installDir }}
- name: toolkit-ready
  image: {{ include "gpu-stack.image" $root.Values.toolkit.image }}
  imagePullPolicy: {{ $root.Values.toolkit.image.pullPolicy }}
  command: ["sh", "-c"]
  args:
    - |
      marker={{ $marker }}
      rm -f "$marker"
      trap 'rm -f "$marker"; exit 0' TERM INT
      while true; do
        if [ -x {{ $runtime }} ] && grep -qs {{ $runtime }} {{ .config }}; then
          [ -f "$marker" ] || { touch "$marker" && echo "runtime configured: wrote $marker"; }
        elif [ -f "$marker" ]; then
          rm -f "$marker" && echo "runtime config reverted: removed $marker"
        fi
        sleep 5 & wait $!
      done
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  {{- with $root.Values.gpuNodes.helperResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  readinessProbe:
    exec:
      command: ["test", "-f", {{ $marker | quote }}]
    periodSeconds: 5
  {{- /* Alive while the marker agrees with the runtime config (written when configured). */}}
  livenessProbe:
    exec:
      command: ["sh", "-c", {{ printf "! { [ -x %s ] && grep -qs %s %s; } || test -f %s" $runtime $runtime .config $marker | quote }}]
    initialDelaySeconds: 30
    periodSeconds: 30
    failureThreshold: 4
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: toolkit-install-dir
      mountPath: {{ $root.Values.toolkit.installDir }}
      readOnly: true
    - name: {{ .configVolume }}
      mountPath: {{ dir .config }}/
      readOnly: true
    - name: run-nvidia-validations
      mountPath: {{ include "gpu-stack.validationsDir" $root }}
{{- end }}

{{/*
The bring-up stages the chart renders, in order (YAML list of {name, marker, daemonSets}): the
driver, the toolkit, then every GPU agent. For NOTES.txt and the bring-up helm test.
*/}}
{{- define "gpu-stack.bringUpStages" -}}
{{- $name := dict "root" . }}
{{- $stages := list }}
{{- if .Values.driver.enabled }}
{{- $stages = append $stages (dict "name" "driver" "marker" "driver-ready" "daemonSets" (list (include "gpu-stack.componentName" (dict "root" . "component" "driver")))) }}
{{- end }}
{{- if .Values.toolkit.enabled }}
{{- $stages = append $stages (dict "name" "container toolkit" "marker" "toolkit-ready" "daemonSets" (list (include "gpu-stack.componentName" (dict "root" . "component" "container-toolkit")))) }}
{{- end }}
{{- $agents := list }}
{{- if .Values.devicePlugin.enabled }}{{ $agents = append $agents "device-plugin" }}{{ end }}
{{- if .Values.gfd.enabled }}{{ $agents = append $agents "gpu-feature-discovery" }}{{ end }}
{{- if .Values.dcgmExporter.enabled }}{{ $agents = append $agents "dcgm-exporter" }}{{ end }}
{{- if include "gpu-stack.mpsDaemonEnabled" . }}{{ $agents = append $agents "mps-control-daemon" }}{{ end }}
{{- if .Values.migManager.enabled }}{{ $agents = append $agents "mig-manager" }}{{ end }}
{{- $names := list }}
{{- range $agents }}{{ $names = append $names (include "gpu-stack.componentName" (dict "root" $ "component" .)) }}{{ end }}
{{- if $names }}
{{- $stages = append $stages (dict "name" "GPU agents" "marker" "" "daemonSets" $names) }}
{{- end }}
{{- toYaml $stages }}
{{- end }}
