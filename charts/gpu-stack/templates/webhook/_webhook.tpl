{{/* Name of the webhook's objects (Deployment, Service, ServiceAccount, webhook configurations). */}}
{{- define "gpu-stack.webhook.name" -}}
{{- include "gpu-stack.componentName" (dict "root" . "component" "webhook") }}
{{- end }}

{{/* The Secret holding the webhook's serving certificate (tls.crt, tls.key; self-managed: also the CA). */}}
{{- define "gpu-stack.webhook.tlsSecretName" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-tls" (include "gpu-stack.webhook.name" .)) }}
{{- end }}

{{/* cert-manager Certificate that serves the webhook (also the inject-ca-from source). */}}
{{- define "gpu-stack.webhook.certificateName" -}}
{{- printf "%s-tls" (include "gpu-stack.webhook.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Namespaces the webhook never judges, as a YAML list: the release namespace, kube-system, extras. */}}
{{- define "gpu-stack.webhook.exemptNamespaces" -}}
{{- $names := concat (list .Release.Namespace "kube-system") .Values.webhook.policy.extraExemptNamespaces }}
{{- toYaml (uniq $names) }}
{{- end }}

{{/* Webhook image "repository:tag", or "repository@digest" when webhook.image.digest is set; the tag defaults
to the chart's appVersion. webhook.image.registry (a mirror) replaces the repository's registry host, or
prefixes a repository without one. No repository: validate.yaml stops an install (Helm talks to a cluster),
and a render without one (helm template, Argo CD) names a registry under the reserved .invalid domain that
says what to set, so the diff shows it and the kubelet's pull error names it. */}}
{{- define "gpu-stack.webhook.image" -}}
{{- $img := .Values.webhook.image }}
{{- $repository := $img.repository | default "set-webhook-image-repository.invalid/gpu-stack-webhook" }}
{{- if $img.registry }}
{{- $parts := splitn "/" 2 $repository }}
{{- $first := $parts._0 }}
{{- if and $parts._1 (or (contains "." $first) (contains ":" $first) (eq "localhost" $first)) }}
{{- $repository = $parts._1 }}
{{- end }}
{{- $repository = printf "%s/%s" $img.registry $repository }}
{{- end }}
{{- if $img.digest }}
{{- printf "%s@%s" $repository $img.digest }}
{{- else }}
{{- include "gpu-stack.image" (dict "repository" $repository "tag" ($img.tag | default .Chart.AppVersion)) }}
{{- end }}
{{- end }}

{{/*
The webhook's policy file (webhook/src/gpu_stack_webhook/policy/config.py). sharing.configs is exactly the
device plugin config files of gpu-stack.devicePluginConfigs, so the webhook judges pods against what
the nodes expose.
*/}}
{{- define "gpu-stack.webhook.policy" -}}
{{- $p := .Values.webhook.policy }}
{{- $sharing := dict
      "nodeConfigLabel" "nvidia.com/device-plugin.config"
      "defaultConfig" .Values.sharing.defaultConfig
      "configs" (include "gpu-stack.devicePluginConfigs" . | fromYaml) }}
{{- $policy := dict
      "exemptNamespaces" (include "gpu-stack.webhook.exemptNamespaces" . | fromYamlArray)
      "gpuResources" (dict "prefixes" $p.gpuResources.prefixes "names" $p.gpuResources.names)
      "gpuRuntimeClassNames" $p.gpuRuntimeClassNames
      "nonGpuRuntimeClassNames" $p.nonGpuRuntimeClassNames
      "nvidiaRuntimeHandlers" (include "gpu-stack.webhook.nvidiaRuntimeHandlers" . | fromYamlArray)
      "injectRuntimeClassName" (include "gpu-stack.gpuPodRuntimeClass" .)
      "nvidiaRuntimeIsDefault" (has (include "gpu-stack.runtimeLayout" .) (list "default-runtime" "preinstalled"))
      "maxRequestBytes" (int64 $p.maxRequestBytes)
      "sharing" $sharing
      "mps" (dict "annotation" $p.mps.annotation "nodeSelector" $p.mps.nodeSelector "tolerations" $p.mps.tolerations "injectHostIPC" $p.mps.injectHostIPC "podSecurityConflict" $p.mps.podSecurityConflict)
      "rules" (dict "disabled" $p.rules.disabled "migUnexposed" $p.rules.migUnexposed)
      "dra" (dict "gpuDeviceClasses" $p.dra.gpuDeviceClasses "allocationModeAllNamespaces" $p.dra.allocationModeAllNamespaces "adminAccessNamespaces" $p.dra.adminAccessNamespaces "sharingStrategies" (include "gpu-stack.dra.sharingStrategies" . | fromJsonArray) "mpsDefaultPinnedDeviceMemoryLimit" $p.dra.mpsDefaultPinnedDeviceMemoryLimit "unresolvedClaims" ($p.dra.unresolvedClaims | default (ternary "deny" "warn" (eq .Values.webhook.failurePolicy "Fail")))) }}
{{- toYaml $policy }}
{{- end }}

{{/* The runtime handlers that are the NVIDIA runtime: webhook.policy.nvidiaRuntimeHandlers, and the handler
this chart's toolkit registers (NVIDIA_RUNTIME_NAME = toolkit.runtimeClass.name). */}}
{{- define "gpu-stack.webhook.nvidiaRuntimeHandlers" -}}
{{- $handlers := .Values.webhook.policy.nvidiaRuntimeHandlers }}
{{- if .Values.toolkit.enabled }}
{{- $handlers = append $handlers .Values.toolkit.runtimeClass.name }}
{{- end }}
{{- toYaml (uniq $handlers) }}
{{- end }}

{{/* "true" when the webhook reads the cluster's RuntimeClasses (serve --runtime-classes live): with API
lookups, or when it follows another project's GPU configuration. */}}
{{- define "gpu-stack.webhook.followsRuntimeClasses" -}}
{{- if or .Values.webhook.lookups.enabled (ne .Values.webhook.policySource.mode "values") }}true{{ end }}
{{- end }}

{{/* namespaceSelector shared by both webhook configurations: skip exempt and opted-out namespaces. */}}
{{- define "gpu-stack.webhook.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- include "gpu-stack.webhook.exemptNamespaces" . | nindent 8 }}
    {{- with .Values.webhook.namespaceOptOutLabel }}
    - key: {{ . }}
      operator: NotIn
      values: [disabled]
    {{- end }}
{{- end }}

{{/*
matchConditions of one webhook: the API server calls it only for requests a rule can act on (README
"When the webhook is down"). The expression is generated from the rules' SCOPE into
files/match-conditions.yaml (`make generate`); each `${name}` in it
becomes that config value of gpu-stack.cel.configValues as a JSON literal, as
match_conditions.expression() does offline. Call with (dict "root" $ "webhook" "mutate"|"validate").
*/}}
{{- define "gpu-stack.webhook.matchConditions" -}}
{{- $generated := .root.Files.Get "files/match-conditions.yaml" | fromYaml }}
{{- $values := include "gpu-stack.cel.configValues" .root | fromYaml }}
{{- $expression := get $generated .webhook }}
{{- range $name := $generated.configNames }}
{{- $expression = replace (printf "${%s}" $name) (toJson (get $values $name)) $expression }}
{{- end }}
matchConditions:
  - name: judged-by-a-gpu-rule
    expression: {{ $expression | quote }}
{{- end }}

{{/* clientConfig of one webhook. Call with (dict "root" $ "path" "/mutate"). */}}
{{- define "gpu-stack.webhook.clientConfig" -}}
{{- $root := .root }}
clientConfig:
  service:
    name: {{ include "gpu-stack.webhook.name" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- if and (eq $root.Values.webhook.tls.mode "secret") $root.Values.webhook.tls.caBundle }}
  caBundle: {{ $root.Values.webhook.tls.caBundle | trim | b64enc }}
  {{- end }}
{{- end }}

{{/*
Metadata annotations of the webhook configurations: cert-manager's cainjector fills caBundle in mode
cert-manager; in mode self-managed the webhook patches it itself (and no caBundle is rendered).
*/}}
{{- define "gpu-stack.webhook.configAnnotations" -}}
{{- if eq .Values.webhook.tls.mode "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "gpu-stack.webhook.certificateName" .) }}
{{- end }}
{{- end }}

{{/*
Namespace for the helm tests: webhook.helmTests.namespace (validate.yaml rejects an exempt one), else
empty: then every test object stays in the release namespace, which the webhook exempts, so the
denial test is skipped (nothing of the chart goes to "default").
*/}}
{{- define "gpu-stack.webhook.testNamespace" -}}
{{- .Values.webhook.helmTests.namespace }}
{{- end }}

{{/*
The pod the helm test dry-runs (kubectl run --overrides, JSON): Pod Security "restricted" compliant,
so the only thing wrong with it is NVIDIA_VISIBLE_DEVICES=all (webhook rule GPU002). It asks for a GPU:
only GPU pods are sent to the webhook where the NVIDIA runtime is not the default runtime.
*/}}
{{- define "gpu-stack.webhook.deniedTestPod" -}}
{{- $container := dict
      "name" "gpu-stack-test-denied"
      "image" "registry.k8s.io/pause:3.10"
      "env" (list (dict "name" "NVIDIA_VISIBLE_DEVICES" "value" "all"))
      "resources" (dict "limits" (dict "nvidia.com/gpu" "1"))
      "securityContext" (dict "allowPrivilegeEscalation" false "capabilities" (dict "drop" (list "ALL"))) }}
{{- $spec := dict
      "securityContext" (dict "runAsNonRoot" true "runAsUser" 65532 "seccompProfile" (dict "type" "RuntimeDefault"))
      "containers" (list $container) }}
{{- toJson (dict "spec" $spec) }}
{{- end }}

{{/* "true" when the webhook manages its own TLS (Secret, CA, caBundle). */}}
{{- define "gpu-stack.webhook.selfManagedTLS" -}}
{{- if eq .Values.webhook.tls.mode "self-managed" }}true{{ end }}
{{- end }}

{{/* "true" when the webhook pods talk to the Kubernetes API (they then get a ServiceAccount token). */}}
{{- define "gpu-stack.webhook.needsApi" -}}
{{- $w := .Values.webhook }}
{{- if or (include "gpu-stack.webhook.selfManagedTLS" .) $w.lookups.enabled $w.rbac.extraRules $w.rbac.extraClusterRules }}true{{ end }}
{{- end }}
