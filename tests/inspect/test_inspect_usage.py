"""`inspect --usage` / `--idle`: the join of the 4-node test cluster's holders (whole GPU, MIG, time-sliced,
MPS, a DRA claim) with series shaped as dcgm-exporter writes them (gpu_stack_dev.dcgm_fixture), no I/O."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from gpu_stack_dev.dcgm_fixture import Device, PodUse, exposition
from gpu_stack_dev.inspect_cluster import NODES, PODS, chart_configmap
from gpu_stack_webhook.gpuinspect import model, render
from gpu_stack_webhook.gpuinspect.prometheus import Series
from gpu_stack_webhook.gpuinspect.records import Report
from gpu_stack_webhook.gpuinspect.usage import METRICS, Summary, join, parse_window, summaries
from gpu_stack_webhook.gpuinspect.usage import failed as failed_usage
from prometheus_client.parser import text_string_to_metric_families

SCHEMA = Path(render.__file__).with_name("inspect-v1.schema.json")

FIELDS = (("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
          ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
          ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."))
END, WINDOW = 1_800_000_000.0, 1800.0
STEP = WINDOW / 30

DRA_NODE = "gpu-dra"
DRA_SLICE = {"spec": {"driver": "gpu.nvidia.com", "nodeName": DRA_NODE, "pool": {"name": DRA_NODE, "generation": 1},
                      "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                                  {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}}
DRA_CLAIM = {"metadata": {"namespace": "ml", "name": "trainer-gpu"},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.nvidia.com", "pool": DRA_NODE, "device": "gpu-1"}]}},
                 "reservedFor": [{"resource": "pods", "name": "dra-trainer", "uid": "u"}]}}
DRA_NODE_OBJ = {"metadata": {"name": DRA_NODE, "labels": {}}, "status": {}}
DRA_POD = {"metadata": {"namespace": "ml", "name": "dra-trainer"},
           "spec": {"nodeName": DRA_NODE, "containers": [{"name": "train"}]}, "status": {"phase": "Running"}}
DRA_LABELS = {"dra_claim_name": "trainer-gpu", "dra_claim_namespace": "ml", "dra_driver_name": "gpu.nvidia.com",
              "dra_pool_name": DRA_NODE, "dra_device_name": "gpu-1"}


def devices(util: dict[str, float] | None = None) -> list[Device]:
    """The test cluster's GPUs and who uses them how much (percent of the device, or per pod)."""
    u = {"train-bert": 2, "t4-0": 60, "t4-1": 3, "llm-0": 30, "llm-1": 0, "llm-2": 2, "mig-small": 50,
         "mig-medium": 1, "dra": 0.5, **(util or {})}
    return [
        Device("gpu-a100-exclusive", 0, "NVIDIA A100-SXM4-40GB", u["train-bert"], 1200,
               [PodUse("ml", "train-bert", "trainer")]),
        Device("gpu-a100-exclusive", 1, "NVIDIA A100-SXM4-40GB", 0, 0),
        # time-sliced, without --kubernetes-virtual-gpus: one pod per device carries the device's series
        Device("gpu-t4-timesliced", 0, "Tesla T4", u["t4-0"], 4000,
               [PodUse("ml", "notebook-1", "jupyter", 55, 3000, "0"),
                PodUse("ml", "notebook-2", "jupyter", 1, 900, "1")],
               shared=True),
        Device("gpu-t4-timesliced", 1, "Tesla T4", u["t4-1"], 300,
               [PodUse("vision", "detector", "infer", 1, 100, "0"),
                PodUse("vision", "detector", "tracker", 2, 200, "1")],
               shared=True),
        # MPS, with --kubernetes-virtual-gpus: per-process figures per pod
        Device("gpu-l4-mps", 0, "NVIDIA L4", 32, 9000,
               [PodUse("serving", f"llm-{i}", "server", u[f"llm-{i}"], 3000, vgpu=str(i)) for i in range(3)],
               shared=True),
        Device("gpu-a100-mig", 0, "NVIDIA A100-SXM4-40GB", u["mig-small"], 2000, [PodUse("ml", "mig-small", "main")],
               mig_profile="1g.5gb", mig_instance=7),
        Device("gpu-a100-mig", 0, "NVIDIA A100-SXM4-40GB", u["mig-medium"], 500,
               [PodUse("vision", "mig-medium", "main")], mig_profile="3g.20gb", mig_instance=2),
        Device(DRA_NODE, 1, "NVIDIA A100-SXM4-40GB", u["dra"], 100,
               [PodUse("ml", "dra-trainer", "train", dra=DRA_LABELS)]),
    ]


def series_of(text: str, start: float, end: float, step: float) -> dict[str, list[Summary]]:
    """What query_range answers for each metric when every scrape served `text`, summarised."""
    times = [start + i * step for i in range(int((end - start) / step) + 1)]
    out: dict[str, list[Series]] = {m: [] for m in METRICS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(Series(dict(sample.labels), [(t, sample.value) for t in times]))
    return {name: summaries(found) for name, found in out.items()}


def report() -> Report:
    sharing = model.sharing_from_configmap(chart_configmap()["data"])
    return model.build_report([*NODES, DRA_NODE_OBJ], [*PODS, DRA_POD], sharing, resource_slices=[DRA_SLICE],
                              resource_claims=[DRA_CLAIM])


def run(devs: Sequence[Device], virtual: bool = True, start: float = END - WINDOW, skew: float = 0.0) -> Any:
    text = exposition(devs, FIELDS, virtual_gpus=virtual)
    return join(report(), series_of(text, start, END, STEP), window="30m", start=END - WINDOW, end=END, step=STEP,
                below=5.0, where="http://prometheus", skew=skew)


def by_pod(usage: Any) -> dict[tuple[str, str], Any]:
    return {(h.namespace, h.pod, h.resource): h for h in usage.holders}


def test_every_kind_of_holder_gets_the_figures_dcgm_exporter_gives_it() -> None:
    usage = run(devices(), virtual=False)
    rows = {k: (h.sharing, round(h.gpus, 3), h.figures, h.utilization and round(h.utilization.mean, 1),
                h.utilization_metric, h.memory and h.memory.mean) for k, h in by_pod(usage).items()}
    assert rows == {
        ("ml", "train-bert", "nvidia.com/gpu"): ("whole", 1.0, "per-pod", 2.0, "DCGM_FI_DEV_GPU_UTIL", 1200),
        # the exporter names the last pod read for a shared device: the other sharer has no series
        ("ml", "notebook-1", "nvidia.com/gpu"): ("time-slicing", 0.25, "none", None, None, None),
        ("ml", "notebook-2", "nvidia.com/gpu"): ("time-slicing", 0.25, "device-level", 60.0, "DCGM_FI_DEV_GPU_UTIL",
                                                 4000),
        ("vision", "detector", "nvidia.com/gpu"): ("time-slicing", 0.5, "device-level", 3.0, "DCGM_FI_DEV_GPU_UTIL",
                                                   300),
        # MPS without --kubernetes-virtual-gpus: the device's figures, on the last pod
        ("serving", "llm-0", "nvidia.com/gpu"): ("mps", 0.1, "none", None, None, None),
        ("serving", "llm-1", "nvidia.com/gpu"): ("mps", 0.1, "none", None, None, None),
        ("serving", "llm-2", "nvidia.com/gpu"): ("mps", 0.1, "device-level", 32.0, "DCGM_FI_DEV_GPU_UTIL", 9000),
        # MIG: no DCGM_FI_DEV_GPU_UTIL for an instance; the graphics engine's ratio instead
        ("ml", "mig-small", "nvidia.com/mig-1g.5gb"): ("mig", 0.143, "per-pod", 50.0,
                                                       "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 2000),
        ("vision", "mig-medium", "nvidia.com/mig-3g.20gb"): ("mig", 0.429, "per-pod", 1.0,
                                                             "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 500),
        ("ml", "dra-trainer", "gpu.nvidia.com/gpu-1"): ("dra", 1.0, "per-pod", 0.5, "DCGM_FI_DEV_GPU_UTIL", 100),
    }
    assert usage.status == "partial"
    assert usage.notes == ("no usage series for 3 holder pods in the last 30m (ml/notebook-1, serving/llm-0, "
                           "serving/llm-1): started within the window, or not mapped by dcgm-exporter",)


def test_virtual_gpus_give_each_sharing_pod_its_own_figures() -> None:
    usage = by_pod(run(devices(), virtual=True))
    mps = {k[1]: (h.figures, h.utilization.mean, h.memory.mean) for k, h in usage.items() if k[1].startswith("llm")}
    assert mps == {"llm-0": ("per-pod", 30, 3000), "llm-1": ("per-pod", 0, 3000), "llm-2": ("per-pod", 2, 3000)}


def test_idle_holders_are_sorted_by_gpu_hours_wasted() -> None:
    usage = run(devices(), virtual=True)
    idle = [(h.namespace, h.pod, round(h.idle_gpu_hours, 3), h.figures) for h in usage.idle]
    assert idle == [
        ("ml", "dra-trainer", 0.5, "per-pod"), ("ml", "train-bert", 0.5, "per-pod"),
        # a time-sliced device under the threshold: each of its pods is (device-level figures)
        ("vision", "detector", 0.25, "per-pod"), ("vision", "mig-medium", 0.214, "per-pod"),
        ("ml", "notebook-2", 0.125, "per-pod"), ("serving", "llm-1", 0.05, "per-pod"),
        ("serving", "llm-2", 0.05, "per-pod")]
    assert ("ml", "mig-small") not in {(h.namespace, h.pod) for h in usage.idle}  # 50 %


def test_a_shared_device_under_the_threshold_makes_its_pods_idle_device_level() -> None:
    # without --kubernetes-virtual-gpus: the T4 whose series names vision/detector is at 3 %, so is detector
    idle = {(h.pod, h.figures) for h in run(devices(), virtual=False).idle}
    assert ("detector", "device-level") in idle
    assert not {pod for pod, _ in idle} & {"notebook-1", "notebook-2", "llm-0", "llm-1", "llm-2"}


def test_a_holder_whose_series_begin_inside_the_window_is_not_idle_for_it() -> None:
    usage = run(devices(), start=END - WINDOW / 2)
    assert usage.idle == ()
    assert by_pod(usage)[("ml", "train-bert", "nvidia.com/gpu")].utilization.max == 2


def test_no_dcgm_series_at_all_says_so() -> None:
    usage = join(report(), {}, window="30m", start=END - WINDOW, end=END, step=STEP, below=5, where="http://p")
    assert usage.status == "no-series"
    assert usage.notes == ("no dcgm-exporter series (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_PROF_GR_ENGINE_ACTIVE, "
                           "DCGM_FI_DEV_FB_USED) in Prometheus at http://p for the last 30m: is dcgm-exporter "
                           "running (dcgmExporter.enabled) and scraped by this Prometheus?",)
    assert {h.figures for h in usage.holders} == {"none"}


@pytest.mark.parametrize(("skew", "words"), [(42.0, "42 s ahead of"), (-120.0, "120 s behind")])
def test_clock_skew_is_a_note_and_the_window_is_prometheus_s(skew: float, words: str) -> None:
    usage = run(devices(), skew=skew)
    assert usage.status == "partial"
    assert f"clock skew: Prometheus's clock is {words} this machine's; the window is taken on Prometheus's clock" \
        in usage.notes


def test_a_small_skew_is_no_news() -> None:
    assert not [n for n in run(devices(), skew=3.0).notes if "skew" in n]


def test_table_and_json() -> None:
    usage = run(devices(), virtual=True)
    text = render.render(report(), "table", usage=usage, show_usage=True, show_idle=True)
    lines = text.splitlines()
    usage_at = lines.index("usage over the last 30m, Prometheus at http://prometheus")
    assert lines[usage_at + 1:usage_at + 3] == [
        "  POD                 NODE                 RESOURCE                 SHARING        GPUS   UTIL% AVG   "
        "UTIL% MAX   FB MiB AVG   FB MiB MAX   FIGURES",
        "  ml/train-bert       gpu-a100-exclusive   nvidia.com/gpu           whole          1      2           "
        "2           1200         1200         per pod"]
    idle_at = lines.index("idle GPU holders, under 5% GPU utilisation for the last 30m, most GPU-hours first")
    assert lines[idle_at + 1:idle_at + 3] == [
        "  POD                 NODE                 RESOURCE                 SHARING        GPU-HOURS   UTIL% MAX   "
        "FIGURES",
        "  ml/dra-trainer      gpu-dra              gpu.nvidia.com/gpu-1     dra            0.50        0.5         "
        "per pod"]
    doc = json.loads(render.render(report(), "json", usage=usage, show_idle=True))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert (doc["usage"]["status"], doc["usage"]["idle"]["utilizationPercentBelow"]) == ("ok", 5.0)
    assert doc["usage"]["holders"][0] == {
        "namespace": "ml", "name": "train-bert", "node": "gpu-a100-exclusive", "resource": "nvidia.com/gpu",
        "amount": 1, "sharing": "whole", "gpus": 1.0, "figures": "per-pod",
        "utilizationPercent": {"mean": 2.0, "max": 2.0, "first": END - WINDOW, "last": END},
        "utilizationMetric": "DCGM_FI_DEV_GPU_UTIL",
        "memoryUsedMiB": {"mean": 1200.0, "max": 1200.0, "first": END - WINDOW, "last": END},
        "idle": True, "idleGpuHours": 0.5}
    failed = json.loads(render.render(report(), "json", usage=usage_failed()))
    jsonschema.validate(failed, json.loads(SCHEMA.read_text()))
    assert failed["usage"]["idle"] is None and failed["usage"]["status"] == "refused"


def usage_failed() -> Any:
    return failed_usage("http://p", "30m", 5.0, "Prometheus at http://p refused the request (403 Forbidden): no",
                        status="refused")


def test_failed_usage_keeps_the_table() -> None:
    text = render.render(report(), "table", usage=usage_failed(), show_usage=True)
    assert text.startswith("gpu-a100-exclusive   2x NVIDIA-A100-SXM4-40GB")
    assert ("usage over the last 30m, Prometheus at http://p: not shown: Prometheus at http://p refused the request "
            "(403 Forbidden): no\n") in text


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("2h", 7200), ("90s", 90), ("1h30m", 5400)])
def test_windows(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "-5m", "30x"])
def test_bad_windows(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_window(text)
