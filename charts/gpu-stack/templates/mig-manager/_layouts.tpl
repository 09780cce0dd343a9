{{- /*
MIG layouts (mig-parted config format v1) generated from one table of the MIG-capable GPUs the chart
knows, so that every layout only touches the GPUs that can take it (mig-parted skips a GPU that
matches no device-filter entry, and fails on a profile the GPU does not have).
Facts: NVIDIA/mig-parted v0.15.0 deployments/systemd/config-default.yaml (device IDs of the
`all-balanced` filters, the all-<profile> counts and which GPUs each profile is commented for) and
the MIG profile tables of the NVIDIA MIG user guide; tests/chart/test_mig_layouts.py records them.
*/ -}}

{{/*
One entry per GPU family: PCI device IDs (vendor 10de, lower-case as NFD reports them), the
profiles with the most instances of each on one GPU, and the balanced mix of upstream all-balanced.
*/}}
{{- define "gpu-stack.migModels" -}}
a100-40gb:
  gpus: A100-40GB, A800-40GB
  devices: ["20b0", "20b1", "20f1", "20f6"]
  profiles: {1g.5gb: 7, 1g.10gb: 4, 2g.10gb: 3, 3g.20gb: 2, 4g.20gb: 1, 7g.40gb: 1}
  balanced: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}
a100-h100-80gb:
  gpus: A100-80GB, A800-80GB, H100-80GB, H800-80GB
  devices: ["20b2", "20b5", "20f3", "20f5", "2322", "2324", "2330", "2331"]
  profiles: {1g.10gb: 7, 1g.20gb: 4, 2g.20gb: 3, 3g.40gb: 2, 4g.40gb: 1, 7g.80gb: 1}
  balanced: {1g.10gb: 2, 2g.20gb: 1, 3g.40gb: 1}
a30:
  gpus: A30-24GB
  devices: ["20b7"]
  profiles: {1g.6gb: 4, 2g.12gb: 2, 4g.24gb: 1}
  balanced: {1g.6gb: 2, 2g.12gb: 1}
h100-nvl:
  gpus: H100 NVL, H800 NVL
  devices: ["2321", "233a"]
  profiles: {1g.12gb: 7, 1g.24gb: 4, 2g.24gb: 3, 3g.47gb: 2, 4g.47gb: 1, 7g.94gb: 1}
  balanced: {1g.12gb: 2, 2g.24gb: 1, 3g.47gb: 1}
h100-96gb:
  gpus: H100-96GB, PG506-96GB, GH200 96GB, H20
  devices: ["20b6", "2329", "233d", "2342"]
  profiles: {1g.12gb: 7, 1g.24gb: 4, 2g.24gb: 3, 3g.48gb: 2, 4g.48gb: 1, 7g.96gb: 1}
  balanced: {1g.12gb: 2, 2g.24gb: 1, 3g.48gb: 1}
h200:
  gpus: H200-141GB
  devices: ["2335"]
  profiles: {1g.18gb: 7, 1g.35gb: 4, 2g.35gb: 3, 3g.71gb: 2, 4g.71gb: 1, 7g.141gb: 1}
  balanced: {1g.18gb: 2, 2g.35gb: 1, 3g.71gb: 1}
h200-nvl:
  gpus: H200 NVL (upstream gives it no 1g.35gb)
  devices: ["233b"]
  profiles: {1g.18gb: 7, 2g.35gb: 3, 3g.71gb: 2, 4g.71gb: 1, 7g.141gb: 1}
  balanced: {1g.18gb: 2, 2g.35gb: 1, 3g.71gb: 1}
gh200-144gb:
  gpus: GH200 144G HBM3e
  devices: ["2348"]
  profiles: {1g.18gb: 7, 1g.36gb: 4, 2g.36gb: 3, 3g.72gb: 2, 4g.72gb: 1, 7g.144gb: 1}
  balanced: {1g.18gb: 2, 2g.36gb: 1, 3g.72gb: 1}
b200:
  gpus: B200
  devices: ["2901"]
  profiles: {1g.23gb: 7, 1g.45gb: 4, 2g.45gb: 3, 3g.90gb: 2, 4g.90gb: 1, 7g.180gb: 1}
  balanced: {1g.23gb: 2, 2g.45gb: 1, 3g.90gb: 1}
gb200:
  gpus: GB200
  devices: ["2941"]
  profiles: {1g.23gb: 7, 1g.47gb: 4, 2g.47gb: 3, 3g.93gb: 2, 4g.93gb: 1, 7g.186gb: 1}
  balanced: {1g.23gb: 2, 2g.47gb: 1, 3g.93gb: 1}
b300:
  gpus: B300
  devices: ["3182"]
  profiles: {1g.34gb: 7, 1g.67gb: 4, 2g.67gb: 3, 3g.135gb: 2, 4g.135gb: 1, 7g.269gb: 1}
  balanced: {1g.34gb: 2, 2g.67gb: 1, 3g.135gb: 1}
gb300:
  gpus: GB300
  devices: ["31c2"]
  profiles: {1g.35gb: 7, 1g.70gb: 4, 2g.70gb: 3, 3g.139gb: 2, 4g.139gb: 1, 7g.278gb: 1}
  balanced: {1g.35gb: 2, 2g.70gb: 1, 3g.139gb: 1}
rtx-pro-6000:
  gpus: RTX PRO 6000 Blackwell
  devices: ["2bb5"]
  profiles: {1g.24gb: 4, 2g.48gb: 2, 4g.96gb: 1}
  balanced: {1g.24gb: 2, 2g.48gb: 1}
{{- end }}

{{/* mig-parted device-filter values ("0x20B010DE") of a list of device IDs. */}}
{{- define "gpu-stack.migDeviceFilter" -}}
{{- $out := list }}
{{- range . }}{{ $out = append $out (printf "0x%s10DE" (upper .)) }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{/*
The built-in layouts, a YAML map name -> list of entries:
- all-disabled / all-enabled: MIG mode off / on without instances, any GPU;
- all-1g: every GPU in the most instances of its smallest slice (A100-40GB 7x 1g.5gb, 80GB parts
  7x 1g.10gb, A30 4x 1g.6gb, H200 7x 1g.18gb, B200 7x 1g.23gb, ...): one size per node, so it
  suits the single strategy on any of these GPUs;
- all-balanced: upstream's mix per GPU (mixed strategy);
- all-<profile> (all-1g.5gb, all-1g.10gb, all-3g.40gb, ...): the most instances of that profile on
  each GPU that has it, restricted to those GPUs.
*/}}
{{- define "gpu-stack.migBuiltinLayouts" -}}
{{- $models := include "gpu-stack.migModels" . | fromYaml }}
{{- $layouts := dict
  "all-disabled" (list (dict "devices" "all" "mig-enabled" false))
  "all-enabled" (list (dict "devices" "all" "mig-enabled" true "mig-devices" (dict))) }}
{{- $smallest := list }}
{{- $balanced := list }}
{{- $byProfile := dict }}
{{- range $name := keys $models | sortAlpha }}
{{- $m := get $models $name }}
{{- $filter := include "gpu-stack.migDeviceFilter" $m.devices | fromYamlArray }}
{{- $balanced = append $balanced (dict "device-filter" $filter "devices" "all" "mig-enabled" true "mig-devices" $m.balanced) }}
{{- $small := "" }}
{{- $most := 0 }}
{{- range $profile := keys $m.profiles | sortAlpha }}
{{- $n := int (get $m.profiles $profile) }}
{{- if gt $n $most }}{{ $most = $n }}{{ $small = $profile }}{{ end }}
{{- $byCount := get $byProfile $profile | default (dict) }}
{{- $_ := set $byCount (toString $n) (concat (get $byCount (toString $n) | default (list)) $filter) }}
{{- $_ := set $byProfile $profile $byCount }}
{{- end }}
{{- $smallest = append $smallest (dict "device-filter" $filter "devices" "all" "mig-enabled" true "mig-devices" (dict $small $most)) }}
{{- end }}
{{- $_ := set $layouts "all-1g" $smallest }}
{{- $_ := set $layouts "all-balanced" $balanced }}
{{- range $profile, $byCount := $byProfile }}
{{- $entries := list }}
{{- range $n := keys $byCount | sortAlpha | reverse }}
{{- $entries = append $entries (dict "device-filter" (get $byCount $n | sortAlpha) "devices" "all" "mig-enabled" true "mig-devices" (dict $profile (int $n))) }}
{{- end }}
{{- $_ := set $layouts (printf "all-%s" $profile) $entries }}
{{- end }}
{{- toYaml $layouts }}
{{- end }}

{{/* Every layout of the mig-parted ConfigMap: the built-in ones with migManager.extraConfigs over them. */}}
{{- define "gpu-stack.migLayouts" -}}
{{- merge (deepCopy .Values.migManager.extraConfigs) (include "gpu-stack.migBuiltinLayouts" . | fromYaml) | toYaml }}
{{- end }}

{{/*
PCI device IDs (lower-case, as NFD's pci.device feature reports them) of the GPUs layout
migManager.defaultConfig fits: those named by its device-filter entries, and for entries without a
filter the known GPUs that have every profile it asks for (at most as many instances as they can
hold). Fails the render when the layout does not exist or fits no known GPU.
*/}}
{{- define "gpu-stack.migDefaultConfigDevices" -}}
{{- $models := include "gpu-stack.migModels" . | fromYaml }}
{{- $name := .Values.migManager.defaultConfig }}
{{- $layouts := include "gpu-stack.migLayouts" . | fromYaml }}
{{- if not (hasKey $layouts $name) }}
{{- fail (printf "gpu-stack: migManager.defaultConfig %q names no MIG layout; use all-1g (smallest slices on every GPU, single strategy), all-balanced (mixed strategy), another built-in layout (all-<profile>, all-disabled) or add it to migManager.extraConfigs" $name) }}
{{- end }}
{{- $ids := list }}
{{- range $entry := get $layouts $name }}
{{- $filter := get $entry "device-filter" }}
{{- if $filter }}
{{- range (kindIs "string" $filter | ternary (list $filter) $filter) }}
{{- $ids = append $ids (lower (substr 2 6 .)) }}
{{- end }}
{{- else }}
{{- $want := get $entry "mig-devices" | default (dict) }}
{{- range $m := values $models }}
{{- $fits := true }}
{{- range $profile, $n := $want }}
{{- if lt (int (get $m.profiles $profile | default 0)) (int $n) }}{{ $fits = false }}{{ end }}
{{- end }}
{{- if $fits }}{{ $ids = concat $ids $m.devices }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $ids }}
{{- fail (printf "gpu-stack: migManager.defaultConfig %q fits none of the MIG-capable GPUs the chart knows (its profiles exist on none of them), so every node it labelled would end in nvidia.com/mig.config.state=failed; use all-1g or all-balanced, or give its entries a device-filter" $name) }}
{{- end }}
{{- $ids | uniq | sortAlpha | toYaml }}
{{- end }}
