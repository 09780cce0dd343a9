"""MIG layouts: every layout only lands on GPUs that have its profiles, and the default-layout NFD rule
only labels nodes whose GPU can take the layout (else mig-parted fails and the node ends in
nvidia.com/mig.config.state=failed).

Upstream facts, NVIDIA/mig-parted v0.15.0 deployments/systemd/config-default.yaml:
- the device IDs per GPU family are those of its `all-balanced` device-filter entries, with the
  family named in the comment above each entry; `all-balanced` and `all-1g.10gb` /
  `all-1g.35gb` are the per-family entries below;
- `devices: all` layouts (all-1g.5gb, all-1g.6gb, ...) give the counts below, for the GPUs named in
  the comment above each group of layouts;
- api/spec/v1/helpers.go MatchesDeviceFilter + cmd/nvidia-mig-parted/assert/assert.go
  WalkSelectedMigConfigForEachGPU: an entry applies to a GPU when its device-filter (one string or a
  list of "0x<DEVICE><VENDOR>") contains the GPU's ID or is empty; a GPU no entry matches is left alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import find, render

A100_40 = ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
GB80 = ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE",
        "0x232410DE"]
A30 = ["0x20B710DE"]
H100_NVL = ["0x232110DE", "0x233A10DE"]
H100_96 = ["0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"]
H200 = ["0x233510DE", "0x233B10DE"]
GH200_144 = ["0x234810DE"]
B200 = ["0x290110DE"]
GB200 = ["0x294110DE"]
B300 = ["0x318210DE"]
GB300 = ["0x31C210DE"]
RTX_PRO_6000 = ["0x2BB510DE"]
FAMILIES = [A100_40, GB80, A30, H100_NVL, H100_96, H200, GH200_144, B200, GB200, B300, GB300, RTX_PRO_6000]
ALL_GPUS = [d for f in FAMILIES for d in f]

UPSTREAM_FILTERED: dict[str, list[tuple[list[str], dict[str, int]]]] = {
    "all-balanced": [
        (GB200, {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),
        (GB300, {"1g.35gb": 2, "2g.70gb": 1, "3g.139gb": 1}),
        (RTX_PRO_6000, {"1g.24gb": 2, "2g.48gb": 1}),
        (B200, {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}),
        (B300, {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}),
        (GH200_144, {"1g.18gb": 2, "2g.36gb": 1, "3g.72gb": 1}),
        (H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        (H100_NVL, {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}),
        (GB80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (A100_40, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        (A30, {"1g.6gb": 2, "2g.12gb": 1}),
        (H100_96, {"1g.12gb": 2, "2g.24gb": 1, "3g.48gb": 1}),
    ],
    "all-1g.10gb": [(GB80, {"1g.10gb": 7}), (A100_40, {"1g.10gb": 4})],
    "all-1g.35gb": [(["0x233510DE"], {"1g.35gb": 4}), (GB300, {"1g.35gb": 7})],
}

# `devices: all` layouts: the counts upstream gives, on the GPUs its comment names for them.
UPSTREAM_UNIFORM: dict[str, tuple[int, list[str]]] = {
    **{f"all-{p}": (n, A100_40) for p, n in
       {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}.items()},
    **{f"all-{p}": (n, GB80) for p, n in
       {"1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}.items()},
    **{f"all-{p}": (n, A30) for p, n in {"1g.6gb": 4, "2g.12gb": 2, "4g.24gb": 1}.items()},
    **{f"all-{p}": (n, H100_NVL + H100_96) for p, n in {"1g.12gb": 7, "2g.24gb": 3}.items()},
    # all-1g.24gb (x4, devices: all) also fits the RTX PRO 6000: 4 slices of 24GB (MIG user guide,
    # supported-gpus.html: "Max Number of Instances" 4; upstream all-balanced gives it 1g.24gb).
    "all-1g.24gb": (4, H100_NVL + H100_96 + RTX_PRO_6000),
    **{f"all-{p}": (n, H100_NVL) for p, n in {"3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1}.items()},
    **{f"all-{p}": (n, H100_96) for p, n in {"3g.48gb": 2, "4g.48gb": 1, "7g.96gb": 1}.items()},
    **{f"all-{p}": (n, GB200) for p, n in
       {"1g.47gb": 4, "2g.47gb": 3, "3g.93gb": 2, "4g.93gb": 1, "7g.186gb": 1}.items()},
    "all-1g.18gb": (7, H200 + GH200_144),
    "all-1g.23gb": (7, GB200 + B200),
    "all-1g.36gb": (4, GH200_144),
    "all-2g.48gb": (2, RTX_PRO_6000),
    "all-4g.96gb": (1, RTX_PRO_6000),
    # Uncommented upstream (the block after all-1g.35gb): counts as upstream gives them, attributed to
    # the family whose all-balanced entry uses the same slice size.
    **{f"all-{p}": (n, H200) for p, n in {"2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1}.items()},
    **{f"all-{p}": (n, GH200_144) for p, n in {"2g.36gb": 3, "3g.72gb": 2, "4g.72gb": 1, "7g.144gb": 1}.items()},
    **{f"all-{p}": (n, B200) for p, n in
       {"1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1}.items()},
    **{f"all-{p}": (n, B300) for p, n in
       {"1g.34gb": 7, "1g.67gb": 4, "2g.67gb": 3, "3g.135gb": 2, "4g.135gb": 1, "7g.269gb": 1}.items()},
    **{f"all-{p}": (n, GB300) for p, n in
       {"1g.70gb": 4, "2g.70gb": 3, "3g.139gb": 2, "4g.139gb": 1, "7g.278gb": 1}.items()},
}


def layouts(overlay: str = "mig-mixed-all-balanced.yaml", values: dict[str, Any] | None = None) -> dict[str, Any]:
    objs = render(3, overlay, values).objects()
    cm = next(c for c in find(objs, "ConfigMap") if "config.yaml" in c.get("data", {}))
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["version"] == "v1"
    return config["mig-configs"]


def applied(layout: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """The entries of a layout mig-parted applies to a GPU with this device ID."""
    out = []
    for entry in layout:
        filt = entry.get("device-filter") or []
        filt = [filt] if isinstance(filt, str) else filt
        if not filt or gpu.upper() in (f.upper() for f in filt):
            out.append(entry)
    return out


def mig_devices(layout: list[dict[str, Any]], gpu: str) -> dict[str, int] | None:
    entries = applied(layout, gpu)
    assert len(entries) <= 1, f"{gpu} matches {len(entries)} entries"
    return entries[0].get("mig-devices") if entries else None


def family_profiles(gpu: str) -> dict[str, int]:
    """Every profile upstream gives this GPU (filtered and uniform layouts), with its count."""
    out: dict[str, int] = {}
    for entries in UPSTREAM_FILTERED.values():
        for gpus, devices in entries:
            if gpu in gpus:
                out.update({p: max(n, out.get(p, 0)) for p, n in devices.items()})
    for name, (n, gpus) in UPSTREAM_UNIFORM.items():
        if gpu in gpus:
            out[name.removeprefix("all-")] = n
    return out


@pytest.mark.parametrize("name", sorted(UPSTREAM_FILTERED))
def test_per_gpu_layouts_match_upstream(name: str) -> None:
    ours = layouts()[name]
    for gpus, want in UPSTREAM_FILTERED[name]:
        for gpu in gpus:
            assert mig_devices(ours, gpu) == want, f"{name} on {gpu}"


@pytest.mark.parametrize("name", sorted(UPSTREAM_UNIFORM))
def test_uniform_layouts_give_upstream_counts_on_the_gpus_they_are_for(name: str) -> None:
    count, gpus = UPSTREAM_UNIFORM[name]
    profile = name.removeprefix("all-")
    for gpu in gpus:
        assert mig_devices(layouts()[name], gpu) == {profile: count}, f"{name} on {gpu}"


def test_no_layout_asks_a_gpu_for_a_profile_it_does_not_have() -> None:
    for name, layout in layouts().items():
        for gpu in ALL_GPUS:
            want = mig_devices(layout, gpu) or {}
            have = family_profiles(gpu)
            for profile, n in want.items():
                assert have.get(profile, 0) >= n, f"{name} asks {gpu} for {n} x {profile}; it has {have}"


def test_all_1g_gives_every_gpu_one_size_of_its_smallest_slice() -> None:
    layout = layouts()["all-1g"]
    for gpu in ALL_GPUS:
        want = mig_devices(layout, gpu)
        assert want is not None and len(want) == 1, f"all-1g leaves {gpu} alone or mixes sizes: {want}"
        (profile, n), = want.items()
        have = family_profiles(gpu)
        assert profile.startswith("1g.") and n == max(have.values()), f"{gpu}: {want}, upstream {have}"


def rule_devices(overlay: str, values: dict[str, Any] | None = None) -> set[str]:
    rules = find(render(3, overlay, values).objects(), "NodeFeatureRule")
    rule = next(r for r in rules if r["metadata"]["name"].endswith("-mig-default-config"))
    (only,) = rule["spec"]["rules"]
    (match,) = only["matchFeatures"]
    assert match["feature"] == "pci.device" and match["matchExpressions"]["vendor"]["value"] == ["10de"]
    return {f"0x{d.upper()}10DE" for d in match["matchExpressions"]["device"]["value"]}


@pytest.mark.parametrize("name", ["all-1g.5gb", "all-1g.10gb", "all-1g", "all-balanced", "all-3g.40gb", "all-1g.24gb",
                                  "all-disabled"])
def test_default_layout_rule_matches_exactly_the_gpus_that_can_take_it(name: str) -> None:
    values = {"migManager.defaultConfig": name}
    layout = layouts(values=values)[name]
    fits = {gpu for gpu in ALL_GPUS if applied(layout, gpu)}
    assert rule_devices("mig-mixed-all-balanced.yaml", values) == fits


def test_mig_single_overlay_serves_every_mig_gpu_with_one_size() -> None:
    overlay = "mig-single-all-1g.yaml"
    objs = render(3, overlay).objects()
    rule = next(r for r in find(objs, "NodeFeatureRule") if r["metadata"]["name"].endswith("-mig-default-config"))
    name = rule["spec"]["rules"][0]["labels"]["nvidia.com/mig.config"]
    assert rule_devices(overlay) == set(ALL_GPUS)
    for gpu in ALL_GPUS:
        want = mig_devices(layouts(overlay)[name], gpu)
        assert want and len(want) == 1, f"single strategy needs one MIG size per node; {gpu} gets {want}"


def test_an_extra_layout_without_filter_lands_only_where_its_profiles_exist() -> None:
    extra = {"seven-tens": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}
    values = {"migManager.extraConfigs": extra, "migManager.defaultConfig": "seven-tens"}
    assert rule_devices("mig-mixed-all-balanced.yaml", values) == set(GB80)


@pytest.mark.parametrize(("name", "extra", "message"), [
    ("all-1g.99gb", {}, 'migManager.defaultConfig "all-1g.99gb" names no MIG layout'),
    ("odd", {"odd": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.99gb": 7}}]},
     'migManager.defaultConfig "odd" fits none of the MIG-capable GPUs'),
])
def test_a_default_layout_no_gpu_can_take_is_refused(name: str, extra: dict[str, Any], message: str) -> None:
    out = render(3, "mig-mixed-all-balanced.yaml",
                 {"migManager.defaultConfig": name, "migManager.extraConfigs": extra})
    assert not out.ok and message in out.stderr, out.stderr
