"""The review path's throughput, latency and memory targets, judged from one `make bench` run
(bench/run_bench.py) for BENCHMARKS.md.

* /validate >= 0.90x and /mutate (with patches) >= 0.85x the bare allow-all's throughput, in every round (the
  ratio of each round uses the baseline of the same round), on the pod mix (gpu_stack_dev.bench.bodies
  `pod_mix`) and on one identical body (`gpu_pod_3c`) alike, with both gunicorn workers holding
  connections in every round and zero errors;
* p99 on /validate at a fixed 1,000 reviews/s <= 1.2x the bare stack's p99 of the same round, every round;
* worker VmRSS <= 60 MB after the 200-container sweep; no growth over the soak (`make soak`, which
  writes bench/soak.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_stack_dev import paths

VALIDATE_RATIO = 0.90
MUTATE_RATIO = 0.85
P99_OVER_BARE = 1.2
RSS_MB = 60.0
SOAK = paths.BENCH / "soak.md"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def round_ratios(sat: dict[str, Any], name: str) -> list[float]:
    """Throughput of `name` over the baseline's, round by round (same round, same noise)."""
    return [r.rps / b.rps if b.rps else 0.0 for r, b in zip(sat[name].runs, sat["baseline"].runs, strict=True)]


def spread_ok(run: Any) -> bool:
    return len(run.spread) >= 2 and all(n > 0 for n in run.spread.values())


def _spread(run: Any) -> str:
    return "/".join(str(n) for n in sorted(run.spread.values())) or "?"


def soak_verdict() -> tuple[str, bool | None]:
    """The soak's own verdict line from bench/soak.md (hack/soak.py --report), if it was run."""
    if not SOAK.is_file():
        return "not run (`make soak` writes bench/soak.md)", None
    for line in SOAK.read_text(encoding="utf-8").splitlines():
        if line.startswith("Verdict:"):
            text = line.removeprefix("Verdict:").strip()
            return text, text.startswith("passed")
    return "bench/soak.md has no verdict line", False


def _round_table(title: str, sat: dict[str, Any], v_ratios: list[float], m_ratios: list[float]) -> list[str]:
    out = [title, "", "| round | baseline reviews/s | /validate reviews/s | x baseline | /mutate reviews/s | "
           "x baseline | connections per worker (b / v / m) | errors |", "|---:|---:|---:|---:|---:|---:|---|---:|"]
    for i in range(len(sat["baseline"].runs)):
        b, v, m = (sat[n].runs[i] for n in ("baseline", "validate", "mutate"))
        out.append(f"| {i + 1} | {b.rps:,.0f} | {v.rps:,.0f} | {v_ratios[i]:.2f} | {m.rps:,.0f} | {m_ratios[i]:.2f} | "
                   f"{_spread(b)} / {_spread(v)} / {_spread(m)} | {b.errors + v.errors + m.errors} |")
    out.append("")
    return out


def render(results: dict[str, Any], out_dir: Path) -> list[str]:
    sat, paced, plan = results["saturation"], results["paced"], results["plan"]
    same = results.get("saturation_same") or {}
    out = ["## Targets", ""]
    w = out.append
    slices = plan.get("saturation_slices", 1)
    split = (f" as {slices} runs of {plan['saturation_s'] / slices:g} s in mirrored order (baseline, validate, "
             f"mutate, then mutate, validate, baseline, and so on: a drift of the machine's speed over the round falls "
             f"on all three alike, and the finer the slices, the less a passing burst of other work on the machine "
             f"weighs on one server's share)" if slices > 1 else "")
    w(f"Same run, rounds alternating baseline / validate / mutate (order reversed every other round); "
      f"closed loop with {plan['saturation_connections']} keep-alive TLS connections, {plan['saturation_s']} s per "
      f"server per round{split}; the pod mix (see above; /mutate patches its GPU, MPS and MIG pods). The same "
      f"rounds on one identical body (the recorded GPU pod with 3 containers x 20 env vars; /mutate: with the MPS "
      f"annotation, so the answer carries a patch) ran after them, judged by the same ratios. "
      f"Connections per worker: established sockets in each worker's /proc/PID/fd, sampled mid-round "
      f"(baseline / validate / mutate).")
    w("")
    v_ratios, m_ratios = round_ratios(sat, "validate"), round_ratios(sat, "mutate")
    out.extend(_round_table("The pod mix:", sat, v_ratios, m_ratios))
    sv_ratios = round_ratios(same, "validate") if same else []
    sm_ratios = round_ratios(same, "mutate") if same else []
    if same:
        out.extend(_round_table("One identical body:", same, sv_ratios, sm_ratios))
    p_base, p_val = paced["baseline"].runs, paced["validate"].runs
    w(f"Fixed rate: {plan['paced_rate']:,} reviews/s offered on /validate (open loop: bench/mix.lua paces wrk's "
      f"sends on a fixed schedule over {plan['paced_connections']} connections and counts sends that missed their "
      f"slot), {plan['paced_s']} s per server per round:")
    w("")
    w("| round | bare p50 / p99 ms | /validate p50 / p99 ms | /validate achieved/s | late sends (bare / validate) |")
    w("|---:|---:|---:|---:|---:|")
    for i, (b, v) in enumerate(zip(p_base, p_val, strict=True)):
        w(f"| {i + 1} | {b.latency_us['p50'] / 1000:.2f} / {b.latency_us['p99'] / 1000:.2f} | "
          f"{v.latency_us['p50'] / 1000:.2f} / {v.latency_us['p99'] / 1000:.2f} | {v.rps:,.0f} | {b.late} / {v.late} |")
    w("")

    errors = sum(r.errors for s in [*sat.values(), *same.values(), *paced.values()] for r in s.runs)
    spreads = [spread_ok(r) for s in sat.values() for r in s.runs]
    p99s = [r.latency_us["p99"] / 1000 for r in p_val]
    bare_p99s = [r.latency_us["p99"] / 1000 for r in p_base]
    p99_ratios = [v / b if b else float("inf") for v, b in zip(p99s, bare_p99s, strict=True)]
    rss = [wk["rss_kb"] / 1024 for wk in results["memory_after"]["webhook"]["workers"]]
    soak_text, soak_ok = soak_verdict()
    fmt = ", ".join
    w("| target | per round | result |")
    w("|---|---|---|")
    for body, ratios in (("pod mix", (v_ratios, m_ratios)), ("one identical body", (sv_ratios, sm_ratios))):
        for what, floor, per_round in (("/validate", VALIDATE_RATIO, ratios[0]),
                                       ("/mutate (patched)", MUTATE_RATIO, ratios[1])):
            w(f"| {what} >= {floor:.2f}x the bare allow-all, every round ({body}) | "
              f"{fmt(f'{x:.2f}' for x in per_round) or 'not run'} | "
              f"{verdict(bool(per_round) and min(per_round) >= floor)} |")
    w(f"| connections on both workers, every round | {sum(spreads)} of {len(spreads)} runs | {verdict(all(spreads))} |")
    w(f"| zero errors (saturation, both bodies, and fixed rate) | {errors} | {verdict(errors == 0)} |")
    w(f"| /validate p99 <= {P99_OVER_BARE:.1f}x the bare allow-all's at {plan['paced_rate']:,}/s, every round | "
      f"{fmt(f'{x:.2f}' for x in p99s)} ms (bare {fmt(f'{x:.2f}' for x in bare_p99s)} ms: "
      f"{fmt(f'{x:.2f}x' for x in p99_ratios)}) | {verdict(bool(p99s) and max(p99_ratios) <= P99_OVER_BARE)} |")
    w(f"| worker VmRSS <= {RSS_MB:.0f} MB after the 200-container sweep | {fmt(f'{x:.1f}' for x in rss)} MB | "
      f"{verdict(bool(rss) and max(rss) <= RSS_MB)} |")
    w(f"| no worker RSS growth over the 10-minute soak | {soak_text} | "
      f"{'not measured' if soak_ok is None else verdict(soak_ok)} |")
    w("")
    graphs = results.get("flamegraphs") or {}
    if graphs:
        links = []
        for name, g in graphs.items():
            ep, _, one = name.partition("-")
            label = f"/{ep}" + (" (one identical body)" if one else " (pod mix)")
            if g.get("skipped"):
                links.append(f"{label}: skipped ({g['skipped']})")
            else:
                links.append(f"[{label}]({os.path.relpath(g['svg'], out_dir)})")
        w(f"Flame graphs under load (py-spy `record --gil --native --subprocesses` on the gunicorn master, both "
          f"workers, {plan['profile_s']} s at saturation, this run; the GIL holder only, so TLS and socket writes "
          f"are in the layer table below, not here): " + ", ".join(links) + ".")
        w("")
    return out
