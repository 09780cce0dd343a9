{{/*
The CEL admission policies (webhook.validation.mode cel|both, webhook.mutation.mode cel). Their
expressions are written by hand beside the Python rules (gpu_stack_webhook.cel, sharing their IDs,
constants and config, not their code; tests/property/test_cel_equivalence.py checks that both decide
alike) and rendered into files/cel-policies.yaml (do not edit it: run
`make generate`); what depends on the values is passed in as config variables,
computed here from the webhook's own policy (gpu-stack.webhook.policy) exactly as
gpu_stack_webhook.cel.library.config_values computes them (tests/chart/test_cel_policies.py compares).
*/}}

{{/* "true" when a webhook process runs: webhook on, and at least one of the two modes is `webhook`/`both`. */}}
{{- define "gpu-stack.webhook.process" -}}
{{- $w := .Values.webhook }}
{{- if and $w.enabled (or (ne $w.validation.mode "cel") (ne $w.mutation.mode "cel")) }}true{{ end }}
{{- end }}

{{/* "true" when the validating webhook is registered (mode webhook or both). */}}
{{- define "gpu-stack.webhook.validates" -}}
{{- if and .Values.webhook.enabled (ne .Values.webhook.validation.mode "cel") }}true{{ end }}
{{- end }}

{{/* "true" when the mutating webhook is registered (mutation mode webhook). */}}
{{- define "gpu-stack.webhook.mutates" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.mutation.mode "webhook") }}true{{ end }}
{{- end }}

{{/* "true" when the API server serves `kind` (ValidatingAdmissionPolicy, MutatingAdmissionPolicy) in v1. */}}
{{- define "gpu-stack.cel.served" -}}
{{- $root := .root }}
{{- if or $root.Values.webhook.cel.assumeServed ($root.Capabilities.APIVersions.Has (printf "admissionregistration.k8s.io/v1/%s" .kind)) }}true{{ end }}
{{- end }}

{{/* What Helm's Capabilities say the cluster serves of one kind (dict "root" "group" "kind" "versions"): e.g.
"Kubernetes v1.34.9, which serves admissionregistration.k8s.io MutatingAdmissionPolicy only as v1beta1, which the chart does not use", or
"... serves no resource.k8s.io DeviceClass" (`gpu-stack:` messages of validate.yaml: the version found). */}}
{{- define "gpu-stack.api.found" -}}
{{- $root := .root }}
{{- $group := .group }}
{{- $kind := .kind }}
{{- $served := list }}
{{- range $v := .versions }}
{{- if $root.Capabilities.APIVersions.Has (printf "%s/%s/%s" $group $v $kind) }}{{ $served = append $served $v }}{{ end }}
{{- end }}
{{- printf "Kubernetes %s, which serves " $root.Capabilities.KubeVersion.Version }}
{{- if $served }}{{ printf "%s %s only as %s, which the chart does not use" $group $kind (join ", " $served) }}{{ else }}{{ printf "no %s %s" $group $kind }}{{ end }}
{{- end }}

{{/* The config variables as a YAML map name -> value (gpu_stack_webhook.cel.library.config_values). */}}
{{- define "gpu-stack.cel.configValues" -}}
{{- $policy := include "gpu-stack.webhook.policy" . | fromYaml }}
{{- $sharing := $policy.sharing }}
{{- $gpuNames := $policy.gpuResources.names }}
{{- $exposed := dict }}
{{- $replaced := dict }}
{{- $overriding := list }}
{{- $mixed := list }}
{{- $mps := list }}
{{- range $name, $cfg := $sharing.configs }}
{{- $mig := $cfg.flags.migStrategy | default "none" }}
{{- $strategies := $cfg.flags.plugin.deviceListStrategy | default "envvar" }}
{{- if kindIs "string" $strategies }}{{ $strategies = list $strategies }}{{ end }}
{{- range $s := list "envvar" "volume-mounts" "cdi-annotations" }}
{{- if has $s $strategies }}{{ $overriding = append $overriding $name }}{{ end }}
{{- end }}
{{- if eq $mig "mixed" }}{{ $mixed = append $mixed $name }}{{ end }}
{{- $out := dict "nvidia.com/gpu" "exclusive" }}
{{- $gone := list }}
{{- $section := dict }}
{{- $strategy := "" }}
{{- $sh := $cfg.sharing | default dict }}
{{- if and $sh.mps $sh.mps.resources }}{{ $section = $sh.mps }}{{ $strategy = "mps" }}
{{- else if $sh.timeSlicing }}{{ $section = $sh.timeSlicing }}{{ $strategy = "time-slicing" }}{{ end }}
{{- range $mode := list "timeSlicing" "mps" }}
{{- range $r := (get $sh $mode | default dict).resources | default list }}
{{- $base := ternary $r.name (printf "nvidia.com/%s" $r.name) (hasPrefix "nvidia.com/" $r.name) }}
{{- $gpuNames = concat $gpuNames (list $base (printf "%s.shared" $base)) }}
{{- with $r.rename }}{{ $gpuNames = append $gpuNames (ternary . (printf "nvidia.com/%s" .) (hasPrefix "nvidia.com/" .)) }}{{ end }}
{{- end }}
{{- end }}
{{- range $r := $section.resources | default list }}
{{- $base := ternary $r.name (printf "nvidia.com/%s" $r.name) (hasPrefix "nvidia.com/" $r.name) }}
{{- if or (eq $base "nvidia.com/gpu") (and (eq $mig "mixed") (hasPrefix "nvidia.com/mig-" $base)) }}
{{- $_ := unset $out $base }}
{{- $shared := ternary (printf "%s.shared" $base) $base (default false $section.renameByDefault) }}
{{- if ne $shared $base }}{{ $gone = append $gone $base }}{{ end }}
{{- $_ := set $out $shared $strategy }}
{{- end }}
{{- end }}
{{- $left := list }}
{{- range $gone }}{{ if not (hasKey $out .) }}{{ $left = append $left . }}{{ end }}{{ end }}
{{- $_ := set $exposed $name $out }}
{{- $_ := set $replaced $name ($left | uniq | sortAlpha) }}
{{- if has "mps" (values $out) }}{{ $mps = append $mps $name }}{{ end }}
{{- end }}
{{- $m := $policy.mps }}
{{- $gpuNames = $gpuNames | uniq | sortAlpha }}
{{- $gpuPrefixes := $policy.gpuResources.prefixes | uniq | sortAlpha }}
{{- /* gpu_stack_webhook.cel.library.gpu_resource_pattern */}}
{{- $alternatives := list }}
{{- range $gpuNames }}{{ $alternatives = append $alternatives (printf "%s$" (regexQuoteMeta .)) }}{{ end }}
{{- range $gpuPrefixes }}{{ $alternatives = append $alternatives (regexQuoteMeta .) }}{{ end }}
{{- $pattern := ternary (printf "^(?:%s)" (join "|" $alternatives)) "^$" (gt (len $alternatives) 0) }}
{{- $values := dict
      "gpuNames" $gpuNames
      "gpuPrefixes" $gpuPrefixes
      "gpuResourcePattern" $pattern
      "gpuRuntimeClassNames" ($policy.gpuRuntimeClassNames | sortAlpha)
      "nonGpuRuntimeClassNames" ($policy.nonGpuRuntimeClassNames | uniq | sortAlpha)
      "configLabel" $sharing.nodeConfigLabel
      "configNames" (keys $sharing.configs | sortAlpha)
      "defaultConfig" $sharing.defaultConfig
      "overridingConfigs" ($overriding | uniq | sortAlpha)
      "exposed" $exposed
      "replaced" $replaced
      "mixedMigConfigs" ($mixed | sortAlpha)
      "mpsConfigNames" ($mps | sortAlpha)
      "mpsAnnotation" $m.annotation
      "mpsNodeSelector" $m.nodeSelector
      "mpsTolerations" $m.tolerations
      "injectHostIPC" $m.injectHostIPC
      "injectRuntimeClassName" $policy.injectRuntimeClassName
      "nvidiaRuntimeIsDefault" $policy.nvidiaRuntimeIsDefault
      "disabledRules" ($policy.rules.disabled | uniq | sortAlpha)
      "draGpuClasses" ($policy.dra.gpuDeviceClasses | uniq | sortAlpha)
      "draAllocationModeAllNamespaces" ($policy.dra.allocationModeAllNamespaces | uniq | sortAlpha)
      "draAdminAccessNamespaces" ($policy.dra.adminAccessNamespaces | uniq | sortAlpha)
      "draSharingStrategies" ($policy.dra.sharingStrategies | uniq | sortAlpha)
      "draMpsDefaultLimit" $policy.dra.mpsDefaultPinnedDeviceMemoryLimit }}
{{- toYaml $values }}
{{- end }}

{{/* The variables of one generated policy: its config variables as CEL (JSON) literals, then its own. */}}
{{- define "gpu-stack.cel.variables" -}}
{{- $values := .values }}
{{- $out := list }}
{{- range .policy.configVariables }}
{{- $out = append $out (dict "name" . "expression" (toJson (get $values .))) }}
{{- end }}
{{- toYaml (concat $out .policy.variables) }}
{{- end }}
