{{/*
Hardening shared by every workload: pod security contexts, the container security context of the
unprivileged helpers, the ServiceAccount token of the containers that call the API, and the scanner
exceptions (checkov skip annotations) each workload declares. The exceptions and their reasons live
here only; the chart README's security section is generated from the rendered objects
(hack/chart-security-table.py) and tests/chart/test_security.py keeps both honest.
*/}}

{{/*
Reasons for the exceptions, by kind. Only these kinds exist: privileged / escalation /
capabilities / root / host namespaces / host paths for agents that drive the GPU or the runtime,
ServiceAccount tokens for pods that call the API, CPU limits, image digests and pull policy,
NetworkPolicy for host-network agents, probes on one-shot test pods, and the webhook's rights on its
own webhook configurations. A reason never contains "=" (checkov splits the annotation on it).
*/}}
{{- define "gpu-stack.security.reasons" -}}
cpuLimit: No CPU limit by design - CFS throttling stalls a node agent or the admission webhook in bursts; the CPU request reserves its share
pullPolicy: imagePullPolicy is a value (default IfNotPresent); pin images by digest rather than re-pulling on every start
digest: Image references are values - set the image tag to TAG@sha256:DIGEST to pin by digest
escalation: Privileged container (CKV_K8S_16) - the API rejects allowPrivilegeEscalation false on a privileged container
capabilities: Privileged container (CKV_K8S_16) - it holds every capability, so a drop list has no effect
rootPrivileged: Privileged GPU/runtime agent running as root (CKV_K8S_16); root-owned device nodes, driver files and host paths
gpuRootfs: The NVIDIA runtime injects the driver into the container root filesystem at start (ldcache hook, nvidia-container-toolkit v1.20.0 internal/ldconfig), which fails on a read-only root
toolkitPrivileged: Installs the NVIDIA runtime into host paths and reconfigures and restarts the host container runtime (nvidia-ctk-installer), as GPU Operator's toolkit
toolkitHostPID: Signals the host containerd/CRI-O process to reload its config after the toolkit changed it
gpuPrivileged: Needs every GPU through NVML while the toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers; upstream device plugin, GFD and GPU Operator run it privileged
mpsPrivileged: Starts nvidia-cuda-mps-control, sets GPU compute modes and mounts the shared MPS tmpfs with Bidirectional propagation (upstream runs it privileged)
mpsHostPID: MPS control and server processes must see the client processes of other pods (GPU Operator runs the MPS daemon with hostPID)
migPrivileged: Repartitions GPUs - stops host GPU clients through systemd, resets GPUs, may reboot the node (upstream mig-parted k8s-mig-manager)
migHostPID: Finds and stops the host processes using the GPUs before a MIG change (upstream mig-parted k8s-mig-manager)
migHostIPC: Upstream mig-parted k8s-mig-manager runs with hostIPC to reach the host GPU clients it stops
driverPrivileged: Builds and loads the NVIDIA kernel modules (insmod, mknod) and mounts the driver root on the host (upstream GPU Operator driver container)
driverHostPID: Upstream GPU Operator v26.7.0 runs the driver container with hostPID (assets/state-driver/0500_daemonset.yaml) - it unloads and reloads kernel modules that host processes may hold
driverRootfs: Installs the driver into its own root filesystem and shares it with the host as /run/nvidia/driver (nvidia-driver init)
draPrivileged: Upstream dra-driver-nvidia-gpu and GPU Operator run the DRA kubelet plugin privileged - it enumerates every GPU through NVML, creates device nodes, writes CDI specs and mounts the kubelet plugin directory with Bidirectional propagation
dcgmPrivileged: Reads every GPU through NVML while unprivileged NVIDIA_VISIBLE_DEVICES is ignored, plus the DCGM profiling counters (SYS_ADMIN); GPU Operator runs it privileged
tokenConfigManager: Only where needed - the pod has no automatic token; a projected token is mounted into the config-manager containers, which read the node label
tokenApi: Calls the Kubernetes API (its RBAC is in the chart README); the token is what it authenticates with
webhookConfigRights: The webhook patches the caBundle of its own two webhook configurations, by resourceName (self-managed TLS)
testProbes: One-shot helm test pod (restartPolicy Never) - it exits with the test result; a probe has nothing to check
{{- end }}

{{/*
checkov skip annotations of one object, as a YAML map (empty string for none). Call with
(dict "root" $ "skips" (list (list "CKV_K8S_16" "gpuPrivileged") ...) "workload" true).
workload: also skip the checks every workload of the chart declares (CPU limits, digest, pull policy).
*/}}
{{- define "gpu-stack.security.checkovSkips" -}}
{{- $reasons := include "gpu-stack.security.reasons" .root | fromYaml }}
{{- $skips := list }}
{{- if .workload }}
{{- $skips = list (list "CKV_K8S_11" "cpuLimit") (list "CKV_K8S_15" "pullPolicy") (list "CKV_K8S_43" "digest") }}
{{- end }}
{{- $skips = concat $skips (.skips | default list) }}
{{- $lines := list }}
{{- range $i, $s := $skips }}
{{- $reason := get $reasons (index $s 1) }}
{{- $lines = append $lines (printf "checkov.io/skip%d: %s" (add1 $i) (printf "%s=%s" (index $s 0) $reason | quote)) }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}

{{/* The exceptions every privileged, root GPU or runtime agent container needs, as a list of pairs. */}}
{{- define "gpu-stack.security.privilegedSkips" -}}
{{- toJson (list (list "CKV_K8S_20" "escalation") (list "CKV_K8S_37" "capabilities") (list "CKV_K8S_28" "capabilities") (list "CKV_K8S_23" "rootPrivileged") (list "CKV_K8S_40" "rootPrivileged")) }}
{{- end }}

{{/* Pod securityContext of the privileged agents: RuntimeDefault seccomp for every unprivileged container in the pod. */}}
{{- define "gpu-stack.security.agentPodSecurityContext" -}}
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/*
securityContext of a container that needs nothing from the host: non-root (65532 unless "uid" is
given; "uid" 0 keeps root for a helper that must signal a root process), read-only root, no
capabilities, no escalation.
*/}}
{{- define "gpu-stack.security.restrictedContainer" -}}
{{- $uid := 65532 }}
{{- if hasKey . "uid" }}{{ $uid = .uid }}{{ end }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  {{- if $uid }}
  runAsNonRoot: true
  runAsUser: {{ $uid }}
  runAsGroup: {{ $uid }}
  {{- else }}
  runAsUser: 0
  {{- end }}
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/*
The ServiceAccount token, CA and namespace as a projected volume, mounted only into the containers
that call the API (pods set automountServiceAccountToken: false). Same files and path as the
kubelet's automatic mount, so in-cluster clients find them.
*/}}
{{- define "gpu-stack.security.apiTokenVolume" -}}
- name: api-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- end }}

{{- define "gpu-stack.security.apiTokenMount" -}}
- name: api-token
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end }}

{{/*
NetworkPolicy admitting no ingress to one component's pods (or only `ports`), egress untouched: the
agents open no port anyone needs to reach, and they all talk to the apiserver.
Call with (dict "root" $ "component" "device-plugin" "ports" (list 9400) "hook" false).
*/}}
{{- define "gpu-stack.security.networkPolicy" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ .name | default (include "gpu-stack.componentName" (dict "root" .root "component" .component)) }}
  namespace: {{ .namespace | default .root.Release.Namespace }}
  labels:
    {{- include "gpu-stack.labels" (dict "root" .root "component" .component) | nindent 4 }}
  {{- if .hook }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "-10"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
  {{- end }}
spec:
  podSelector:
    matchLabels:
      {{- include "gpu-stack.selectorLabels" (dict "root" .root "component" .component) | nindent 6 }}
  policyTypes: [Ingress]
  {{- with .ports }}
  ingress:
    - ports:
        {{- range . }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
  {{- else }}
  ingress: []
  {{- end }}
{{- end }}

{{/* Shell check: at least one nvidia-*.sock in the kubelet's device-plugins directory, and every one a socket. */}}
{{- define "gpu-stack.security.devicePluginSocketCheck" -}}
for s in /var/lib/kubelet/device-plugins/nvidia-*.sock; do [ -S "$s" ] || exit 1; done
{{- end }}

{{/* Shell check: every MPS daemon that has a .started file answers on its pipe directory. Upstream
(k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/root.go) keeps them at <root>/<resource name>/{pipe,.started},
and a resource name is <domain>/<name> (nvidia.com/gpu, nvidia.com/gpu.shared): two levels under /mps. */}}
{{- define "gpu-stack.security.mpsHealthCheck" -}}
for d in /mps/*/*/; do [ -f "$d.started" ] || continue; echo get_default_active_thread_percentage | CUDA_MPS_PIPE_DIRECTORY="${d}pipe" nvidia-cuda-mps-control >/dev/null || exit 1; done
{{- end }}

{{/*
Shell check that the toolkit is installed and the runtime uses it: the installer's pid file,
<installDir>/toolkit/nvidia-container-runtime, and the runtime config file the toolkit writes
(drop-in, or the top-level file for k3s/rke2) naming the runtime `toolkit.runtimeClass.name`.
*/}}
{{- define "gpu-stack.security.toolkitReadyCheck" -}}
{{- $rt := include "gpu-stack.toolkitRuntime" . | fromYaml }}
{{- $config := printf "/runtime/config-dir/%s" (base $rt.config) }}
{{- if $rt.dropIn }}{{ $config = printf "/runtime/config-dir.d/%s" (base $rt.dropIn) }}{{ end }}
{{- printf "test -s /run/nvidia/toolkit/toolkit.pid && test -x %s/toolkit/nvidia-container-runtime && grep -qF 'runtimes.%s' %s" .Values.toolkit.installDir .Values.toolkit.runtimeClass.name $config }}
{{- end }}
