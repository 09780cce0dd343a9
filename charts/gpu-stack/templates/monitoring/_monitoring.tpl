{{/*
The generated monitoring files (files/monitoring/, `make generate`) with their placeholders
(dev/src/gpu_stack_dev/generate/monitoring/placeholders.py) replaced for this release. Call with (dict "root" $ "text" <file content>).
*/}}
{{- define "gpu-stack.monitoring.fill" -}}
{{- $root := .root }}
{{- $rule := $root.Values.monitoring.prometheusRule }}
{{- $jobs := $root.Values.monitoring.jobs }}
{{- $webhookJob := $jobs.webhook | default (include "gpu-stack.webhook.name" $root) }}
{{- $dcgmJob := $jobs.dcgmExporter | default (include "gpu-stack.componentName" (dict "root" $root "component" "dcgm-exporter")) }}
{{- $text := .text }}
{{- $text = $text | replace "__GPU_STACK_NAMESPACE__" $root.Release.Namespace }}
{{- $text = $text | replace "__GPU_STACK_WEBHOOK_JOB__" $webhookJob }}
{{- $text = $text | replace "__GPU_STACK_DCGM_JOB__" $dcgmJob }}
{{- $agents := $root.Values.monitoring.agents }}
{{- $operator := eq $root.Values.webhook.policySource.mode "gpu-operator" }}
{{- /* GPU Operator v26.7.0 assets/state-device-plugin/0500_daemonset.yaml: nvidia-device-plugin-daemonset */ -}}
{{- $agentsNamespace := $agents.namespace | default (ternary $root.Values.webhook.policySource.gpuOperator.namespace $root.Release.Namespace $operator) }}
{{- $pluginDaemonSet := $agents.devicePluginDaemonSet | default (ternary "nvidia-device-plugin-daemonset" (include "gpu-stack.componentName" (dict "root" $root "component" "device-plugin")) $operator) }}
{{- $text = $text | replace "__GPU_STACK_AGENTS_NAMESPACE__" $agentsNamespace }}
{{- $text = $text | replace "__GPU_STACK_DEVICE_PLUGIN_DAEMONSET__" $pluginDaemonSet }}
{{- $text = $text | replace "__GPU_STACK_WEBHOOK_LATENCY_SECONDS__" (toString (mulf $root.Values.webhook.timeoutSeconds $rule.webhookLatencyRatio)) }}
{{- $text = $text | replace "__GPU_STACK_RUNBOOK_BASE__" (trimSuffix "/" $rule.runbookBaseURL) }}
{{- $idle := $root.Values.monitoring.idleGpu }}
{{- $text = $text | replace "__GPU_STACK_IDLE_GPU_PERCENT__" (toString $idle.utilizationPercentBelow) }}
{{- $text = $text | replace "__GPU_STACK_IDLE_GPU_WINDOW__" $idle.window }}
{{- $text = $text | replace "__GPU_STACK_IDLE_GPU_SEVERITY__" $idle.severity }}
{{- $text }}
{{- end }}
