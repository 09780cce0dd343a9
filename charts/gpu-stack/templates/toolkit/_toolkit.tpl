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
{{- /* A containerd that runs with a config of its own: seed the drop-in from that file. The installer's default
sources ask `containerd config dump` first, which reads /etc/containerd/config.toml (v1.20.0
pkg/config/engine/containerd/containerd.go CommandLineSource), and a drop-in seeded from another file's CRI
section replaces the node's own on containerd before 2.1 (getBaseDropInConfigTree). */}}
{{- if and .Values.toolkit.runtimeConfig (eq $p.runtime "containerd") $p.dropIn (not $p.configSource) }}
{{- $_ := set $p "configSource" (printf "file=%s" .Values.toolkit.runtimeConfig) }}
{{- end }}
{{- toYaml $p }}
{{- end }}

{{/* Where the driver root (gpu-stack.driverRoot) is seen inside the toolkit pod: under the host root at /host. */}}
{{- define "gpu-stack.toolkitDriverRootCtrPath" -}}
{{- clean (printf "/host/%s" (include "gpu-stack.driverRoot" .)) }}
{{- end }}

{{/*
The dev-char-symlinks container of the toolkit pod. With systemd cgroup management, a
`systemctl daemon-reload` re-applies each container's device rules from /dev/char/<major>:<minor>
links; NVIDIA device nodes have none, so containers lose their GPUs ("NVML: Unknown Error",
NVIDIA/gpu-operator#430). GPU Operator's validator (driver validation, run as the toolkit pod's
init container) therefore creates a /dev/char link for every possible NVIDIA device node:
createAll, createDeviceNodes, loadKernelModules for a host driver, links written to the host's
/dev/char mounted at /host-dev-char. This container runs the same creator through the CLI the
toolkit installs, `nvidia-ctk system create-dev-char-symlinks`, once nvidia-ctk is in place, then
idles (a DaemonSet container must keep running); it runs again whenever the pod restarts.
*/}}
{{- define "gpu-stack.devCharSymlinksContainer" -}}
{{- $ctk := printf "%s/toolkit/nvidia-ctk" .Values.toolkit.installDir }}
{{- $args := list "system" "create-dev-char-symlinks" "--create-all" "--create-device-nodes" }}
{{- if eq (clean (include "gpu-stack.driverRoot" .)) "/" }}{{ $args = append $args "--load-kernel-modules" }}{{ end }}
{{- $args = concat $args (list (printf "--driver-root=%s" (include "gpu-stack.toolkitDriverRootCtrPath" .)) "--dev-char-path=/host-dev-char") }}
- name: dev-char-symlinks
  image: {{ include "gpu-stack.image" .Values.toolkit.image }}
  imagePullPolicy: {{ .Values.toolkit.image.pullPolicy }}
  command: ["sh", "-c"]
  args:
    - |
      trap 'kill $! 2>/dev/null; exit 0' TERM
      until [ -x {{ $ctk }} ] && {{ $ctk }} {{ join " " $args }}; do
        echo "waiting for the toolkit to install {{ $ctk }} ..."
        sleep 5
      done
      while true; do sleep 3600 & wait $!; done
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  {{- with .Values.gpuNodes.helperResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- /* Ready and alive while the link to the NVIDIA control device (char 195:255, nvidiactl) is there. */}}
  livenessProbe:
    exec:
      command: ["sh", "-c", "test -L /host-dev-char/195:255"]
    initialDelaySeconds: 60
    periodSeconds: 60
    timeoutSeconds: 5
    failureThreshold: 5
  readinessProbe:
    exec:
      command: ["sh", "-c", "test -L /host-dev-char/195:255"]
    periodSeconds: 10
    timeoutSeconds: 5
  securityContext:
    # mknod of the control device nodes, modprobe through the host root, writes to /dev/char.
    privileged: true
    readOnlyRootFilesystem: true
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: host-root
      mountPath: /host
      readOnly: true
      mountPropagation: HostToContainer
    - name: toolkit-install-dir
      mountPath: {{ .Values.toolkit.installDir }}
      readOnly: true
    - name: host-dev-char
      mountPath: /host-dev-char
{{- end }}
