"""The support table (docs/kubernetes-versions.md, README) says what the results file says, per minor."""

from __future__ import annotations

from gpu_stack_dev.generate.support_table import BESIDE_OPERATOR, CELLS, rows

OTHERS = "defaults and every other overlay (not DRA, not policy only) installed and uninstalled"


def results(**outcomes: str) -> dict[str, object]:
    return {"server": "v1.32.13", "kubectl": "v1.32.3", "helm": "v3.17.2", "results": outcomes}


def test_a_refused_dra_overlay_and_an_untested_cell_read_as_such() -> None:
    outcomes = {"install default": "yes", "install exclusive.yaml": "yes", "install dra.yaml": "refused",
                "install dra-mps-memory-slices.yaml": "refused", "CEL mutation": "refused", "webhook mode": "yes"}
    table = dict(rows({"1.32": results(**outcomes)}))
    assert table["API server, kubectl, Helm"] == ["v1.32.13, kubectl v1.32.3, Helm v3.17.2"]
    assert table[OTHERS] == ["yes"]
    assert table["DRA overlays (`dra.yaml`, `dra-mps-memory-slices.yaml`)"] == [CELLS["refused"]]
    assert table["CEL mutation (`webhook.mutation.mode=cel`)"] == [CELLS["refused"]]
    assert table["`kubectl gpu-stack inspect`"] == ["not tested"]


def test_one_failed_overlay_among_the_others_is_not_hidden() -> None:
    table = dict(rows({"1.34": results(**{"install default": "yes", "install k3s.yaml": "refused"})}))
    cell = table[OTHERS]
    assert cell == [f"1: {CELLS['refused']}; 1: yes"]


def test_the_operator_row_is_its_own_result_not_the_policy_only_install() -> None:
    """Policy only installed on a minor says nothing about the real GPU Operator beside it: that row is its own."""
    installed = {"install policy-only-gpu-operator.yaml": "yes"}
    assert dict(rows({"1.32": results(**installed)}))[BESIDE_OPERATOR] == ["not tested"]
    beside = {**installed, "beside the GPU Operator": "yes"}
    assert dict(rows({"1.32": results(**beside)}))[BESIDE_OPERATOR] == ["yes"]
