"""The dashboard previews
(gpu_stack_dev/generate/monitoring/preview.py): each panel drawn from its queries' results in the
dashboard's layout; a panel without results says "No data"."""

from __future__ import annotations

from pathlib import Path

from gpu_stack_dev.generate.monitoring import preview

from .promlib import rendered_dashboards


def fake_query(expr: str) -> list[preview.Series]:
    """Data for the webhook's own metrics only, as in an e2e run without GPU nodes."""
    if "gpu_stack_admission_reviews_total" not in expr:
        return []
    return [({"endpoint": "validate", "decision": "denied"}, [(0.0, 1.0), (60.0, 2.0)])]


def test_previews_draw_every_panel_and_say_no_data(tmp_path: Path) -> None:
    drawn = preview.write_previews(rendered_dashboards(), fake_query, tmp_path, "test")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu-stack-admission.png", "gpu-stack-gpu-fleet.png", "gpu-stack-sharing.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in tmp_path.iterdir())
    with_data = {d.title for d in drawn["gpu-stack-admission"] if d.series}
    assert with_data == {"Reviews per second", "Denied share", "Errors per second", "Reviews by endpoint and outcome"}
    assert not any(d.series for d in drawn["gpu-stack-gpu-fleet"])


def test_legend_fills_the_legend_format() -> None:
    assert preview.legend("{{endpoint}} {{decision}}", {"endpoint": "mutate", "decision": "patched"}) == (
        "mutate patched")
    assert preview.legend("", {"__name__": "up", "job": "x"}) == "job=x"
