"""The HTTP part's section of BENCHMARKS.md (bench/run_bench.py): figures, ratios, targets met or missed, and the
profile's core share; report.py writes the frame around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_stack_dev.bench import layers, provenance, targets
from gpu_stack_dev.bench.report import HTTP_BEGIN, HTTP_END, INSPECT_SCALE, frame_lines, included, refresh_sources


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"

def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"

def _lat(summary: Any, key: str) -> float:
    return float(summary.med(lambda r: r.latency_us[key]))

def render(results: dict[str, Any], command: str, out_dir: Path) -> str:
    m = results["machine"]
    sat = results["saturation"]
    same = results.get("saturation_same", {})
    paced = results["paced"]
    mix = results.get("mix", {})
    out: list[str] = []
    w = out.append
    out.extend(frame_lines())
    w(HTTP_BEGIN)
    w("## The webhook over TLS (bench/run_bench.py)")
    w("")
    w(provenance.stamp(command))
    w("")
    w(f"* Command: `{command}` (from the repository root; {results['elapsed_s']:.0f} s for the HTTP part)")
    w(f"* Machine: {m['nproc']} CPUs (nproc), {m['cpu']}, {m['memory']}, Linux {m['kernel']}, {m['python']}, "
      f"{m['wrk']}; the load generator runs on the same machine.")
    w("* Servers: `gpu-stack-webhook serve` (gunicorn gthread with worker.PollingThreadWorker, "
      f"{results['workers']} workers x "
      f"{results['threads']} threads, TLS 1.2+ with an ECDSA P-256 certificate from certs.py, keep-alive 100 s, "
      "JSON decision log to a file) and the allow-all baseline bench/baseline_app.py with the same gunicorn "
      "settings and certificate. "
      + ("Both run in a private network namespace (so the TCP counters below are the bench's alone)."
         if results["netns"] else "Host network namespace (TCP counters may include other traffic)."))
    w("* Load: wrk over persistent TLS connections with bench/mix.lua. " + mix_text(mix) + " Beside it, the same "
      "rounds on one identical body (the recorded apiserver v1.36 GPU pod with 3 containers x 20 "
      "env vars, gpu_stack_dev.bench.bodies `gpu_pod_3c`; on /mutate with the MPS annotation, so the answer is "
      "patched): every review then hits the webhook's diff memo and last-encoded-patch cache, the best case. The "
      "bare allow-all gets the bodies /validate gets. Rules sweep: the five recorded cases of "
      "gpu_stack_dev.bench.bodies `mix` "
      "(1-container GPU pod, 10 containers x 50 env vars, MPS pod, Deployment template, pod denied for "
      "NVIDIA_VISIBLE_DEVICES). Rounds alternate baseline / validate / mutate.")
    w("* Policy: what the chart renders (`helm template`) for Chart-values-examples/per-node-configs.yaml "
      "(exclusive, time-sliced, MPS and MIG nodes, `mps.injectHostIPC`; the chart's defaults otherwise, so "
      "/mutate also sets runtimeClassName), the one example layout where every kind of pod in the mix is "
      "admissible; default log level (info).")
    plan = results["plan"]
    w(f"* Latency at fixed offered rates: wrk has no constant-rate mode in Debian, so mix.lua paces the sends "
      f"(each free connection claims the next slot of a fixed schedule and waits for it; "
      f"{plan['paced_connections']} connections, so the schedule only slips if every connection is busy, and "
      "such late sends are counted). Latency is wrk's, from the request write to the full response.")
    w("")

    w("## In-process policy core (hack/bench_policy.py)")
    w("")
    w("```")
    w(results.get("bench_policy", "").rstrip())
    w("```")
    w("")

    # --- headline -----------------------------------------------------------------------------------
    base_rps = sat["baseline"].med(lambda r: r.rps)
    base_cpu = sat["baseline"].med(lambda r: r.cpu_us_per_review)
    w("## Headline: the pod mix")
    w("")
    w(f"Saturation: closed loop, {plan['saturation_connections']} keep-alive connections, {plan['rounds']} x "
      f"{plan['saturation_s']} s per server (each round in {plan.get('saturation_slices', 1)} mirrored runs), the "
      f"pod mix; beside it the same rounds on one identical body. Fixed rate: {plan['paced_rounds']} x "
      f"{plan['paced_s']} s at {plan['paced_rate']:,}/s, the pod mix. Medians over the rounds; per-round figures "
      "in \"Targets\".")
    w("")
    w("| | mix: reviews/s | x baseline | CPU µs/review | x baseline | p50 / p99 / p99.9 ms "
      f"@{plan['paced_rate']}/s | errors | TLS handshakes / requests | identical body: reviews/s | x baseline | "
      "CPU µs/review |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    same_base = same["baseline"].med(lambda r: r.rps) if same else 0.0
    for name in ("baseline", "validate", "mutate"):
        s = sat[name]
        rps = s.med(lambda r: r.rps)
        cpu = s.med(lambda r: r.cpu_us_per_review)
        p = paced.get(name)
        lat = f"{_ms(_lat(p, 'p50'))} / {_ms(_lat(p, 'p99'))} / {_ms(_lat(p, 'p999'))}" if p else "-"
        errors = s.errors + (p.errors if p else 0)
        conns = s.connections + (p.connections if p else 0)
        requests = s.requests + (p.requests if p else 0)
        if same:
            o = same[name]
            o_rps = o.med(lambda r: r.rps)
            beside = f"{o_rps:,.0f} | {o_rps / same_base:.2f} | {o.med(lambda r: r.cpu_us_per_review):,.0f}"
        else:
            beside = "- | - | -"
        w(f"| {'/' + name if name != 'baseline' else 'allow-all baseline'} | {rps:,.0f} | {rps / base_rps:.2f} | "
          f"{cpu:,.0f} | {cpu / base_cpu:.2f} | {lat} | {errors} | {conns} / {requests:,} | {beside} |")
    w("")
    w(f"Load average (1/5/15 min) before the HTTP part: {_load(results.get('loadavg_before'))}; after: "
      f"{_load(results.get('loadavg_after'))}.")
    w("")
    out.extend(targets.render(results, out_dir))

    # --- connections ------------------------------------------------------------------------------
    total_requests = sum(r.requests for r in _all_runs(results))
    total_conns = sum(r.connections for r in _all_runs(results))
    w("## Connection reuse")
    w("")
    w(f"Over every wrk run: {total_requests:,} reviews over {total_conns} accepted TCP connections (each one TLS "
      f"handshake; `PassiveOpens` of /proc/net/snmp in the bench's network namespace), i.e. "
      f"{total_requests / max(total_conns, 1):,.0f} reviews per handshake: wrk opens its connections once per run "
      "and gunicorn keeps them alive (keep-alive 100 s, no `Connection: close`).")
    w("")

    # --- memory -----------------------------------------------------------------------------------
    w("## Memory per worker (idle, after the saturation and fixed-rate rounds, after the 200-container sweep)")
    w("")
    w("| server | when | worker VmRSS MB | worker PSS MB | master VmRSS / PSS MB |")
    w("|---|---|---|---|---|")
    for when in ("memory_idle", "memory_loaded", "memory_after"):
        for name in ("webhook", "baseline"):
            mem = results.get(when, {}).get(name)
            if not mem:
                continue
            rss = ", ".join(f"{wk['rss_kb'] / 1024:.1f}" for wk in mem["workers"])
            pss = ", ".join(f"{wk['pss_kb'] / 1024:.1f}" for wk in mem["workers"])
            w(f"| {name} | {when.split('_')[1]} | {rss} | {pss} | {mem['master_rss_kb'] / 1024:.1f} / "
              f"{mem['master_pss_kb'] / 1024:.1f} |")
    w("")
    w("VmRSS counts the pages a worker shares with the master (preload_app: the app is imported before the "
      "fork); PSS splits shared pages among the processes that map them, so master PSS + workers' PSS is the "
      "pod's real footprint.")
    w("")

    # --- sizes ------------------------------------------------------------------------------------
    w("## Latency by pod size")
    w("")
    w(f"/validate of the recorded GPU pod with 1, 10, 50 and 200 containers of 50 env vars each (GPU in the first); "
      f"HTTP at {plan['size_rate']}/s for {plan['size_s']} s per size; in-process: median of json.loads, "
      "Policy.evaluate and the full review (parse + evaluate + response) with no HTTP.")
    w("")
    w("| containers | body KiB | HTTP p50 ms baseline | HTTP p50 ms webhook | webhook - baseline ms | HTTP p99 ms "
      "webhook | in-process json.loads µs | evaluate µs | evaluate µs / container | full review µs |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sizes_ip = {row["containers"]: row for row in results["inprocess_sizes"]}
    for n, summaries in results["sizes"].items():
        ip = sizes_ip[n]
        b50, v50 = _lat(summaries["baseline"], "p50"), _lat(summaries["validate"], "p50")
        w(f"| {n} | {ip['bytes'] / 1024:.0f} | {_ms(b50)} | {_ms(v50)} | {_ms(v50 - b50)} | "
          f"{_ms(_lat(summaries['validate'], 'p99'))} | {ip['json_loads_us']:,.0f} | {ip['evaluate_us']:,.0f} | "
          f"{ip['evaluate_us'] / n:,.1f} | {ip['review_us']:,.0f} |")
    w("")

    # --- rules ------------------------------------------------------------------------------------
    w("## Latency by number of enabled rules")
    w("")
    w(f"The first k rules of the registry enabled (the rest in the policy's `rules.disabled`); HTTP: the /validate "
      f"mix at {plan['rules_rate']}/s for {plan['rules_s']} s against a server started with that policy; "
      "in-process: Policy.evaluate per object of the mix.")
    w("")
    w("| rules | enabled | HTTP p50 ms | HTTP p99 ms | in-process evaluate µs/object |")
    w("|---:|---|---:|---:|---:|")
    http_rules = {row["rules"]: row["summary"] for row in results["rules"]}
    for row in results["inprocess_rules"]:
        k = row["rules"]
        s = http_rules.get(k)
        http = f"{_ms(_lat(s, 'p50'))} | {_ms(_lat(s, 'p99'))}" if s else "- | -"
        w(f"| {k} | {', '.join(row['ids'])} | {http} | {row['evaluate_us']:.1f} |")
    w("")

    # --- where a review's time goes -------------------------------------------------------------------
    out.extend(layers_section(results))

    # --- earlier targets ------------------------------------------------------------------------------
    core = _core_us(results.get("bench_policy", ""))
    per_container = [row["evaluate_us"] / row["containers"] for row in results["inprocess_sizes"]]
    linear = max(per_container[1:]) <= 1.5 * min(per_container[1:]) if len(per_container) > 2 else True
    w("## Earlier targets")
    w("")
    w("| target | result | |")
    w("|---|---|---|")
    w(f"| in-process 3-container GPU pod < 100 µs median | {core:.1f} µs (hack/bench_policy.py) | "
      f"{_verdict(0 < core < 100)} |")
    w(f"| latency linear in containers | evaluate {', '.join(f'{x:.1f}' for x in per_container)} µs per container "
      f"for {', '.join(str(n) for n in sizes_ip)} containers | {_verdict(linear)} |")
    w("")
    w(HTTP_END)
    w("")
    if targets.SOAK.is_file():  # written by `make soak` (hack/soak.py --report), kept here
        out.extend(included("soak", "make soak: bench/soak.md", targets.SOAK, "`make soak` (its date is below)"))
    if INSPECT_SCALE.is_file():  # written by `make bench-inspect` (bench/inspect_scale.py), kept here
        out.extend(included("inspect-scale", "make bench-inspect: bench/inspect-scale.md", INSPECT_SCALE,
                             "`make bench-inspect` (its date is below)"))
    return refresh_sources("\n".join(out))

def mix_text(mix: dict[str, Any]) -> str:
    """One sentence on the pod mix, from bodies.describe (what was sent, counted)."""
    if not mix:
        return "Headline and targets: the pod mix of gpu_stack_dev.bench.bodies `pod_mix`."
    kinds = {"none": "without GPU", "gpu": "whole GPUs", "mps": "MPS", "mig": "MIG slices"}
    shares = ", ".join(f"{k['share']:.0%} {kinds.get(name, name)} ({k['shapes']} shapes)"
                       for name, k in mix["by_kind"].items())
    denied = ", ".join(f"{shape} ({rule})" for shape, rule in mix.get("denied_by", {}).items())
    patches = (f"; the /mutate answers carry {mix['distinct_patches']} distinct JSONPatches"
               if "distinct_patches" in mix else "")
    return (f"Headline and targets: the pod mix (gpu_stack_dev.bench.bodies `pod_mix`): {mix['bodies']:,} pod "
            f"CREATE reviews of {mix['shapes']} distinct shapes, {mix['bytes'] / 1024:.1f} KiB on average, sent in a "
            f"fixed shuffled order: {shares}. Each starts from the review the API server sent for a pod its ReplicaSet "
            "controller created, with its own uid, and mix.lua writes a serial into the uid (and on /validate "
            "the pod name and uid) on every send, so no two requests of a run share them. Most pods of a "
            "cluster have no GPU; the mix is GPU-heavier than a typical cluster on purpose (a GPU pod costs the "
            "webhook more, and with matchConditions the webhook is sent mostly GPU pods). "
            f"/validate denies {mix['denied']} of them ({mix['denied'] / max(1, mix['bodies']):.1%}: {denied}); "
            f"/mutate patches {mix['patched']} ({mix['patched'] / max(1, mix['bodies']):.0%}){patches}.")

_NAMES = {"baseline": "allow-all", "validate": "/validate", "mutate": "/mutate"}
_BODIES = {"mix": ("the pod mix", "saturation"), "one": ("one identical body", "saturation_same")}


def layers_section(results: dict[str, Any]) -> list[str]:
    """The share of each layer of the served path per review, and its microseconds (layers.py)."""
    found = results.get("layers") or {}
    if not found:
        return []
    plan = results["plan"]
    out = ["## Where a review's time goes, layer by layer (this run)", ""]
    w = out.append
    skipped = {case: r["skipped"] for case, r in found.items() if "skipped" in r}
    columns = [(case, r) for case, r in found.items() if "skipped" not in r]
    w(f"py-spy `record --native` on both workers of each server while wrk saturates it ({plan['profile_s']} s, "
      f"{plan['saturation_connections']} connections; the pod mix, then one identical body), every thread sampled "
      "with its C frames: the review path mypyc compiled appears as its C functions, TLS as OpenSSL under `_ssl`. "
      "Samples of a thread that waits (the GIL, a lock, the poller, a sleep) are dropped; each busy sample goes "
      "to the layer of the deepest frame of its stack that names one (gpu_stack_dev.bench.layers), the rest is "
      "gunicorn. µs per review: the layer's share times the median CPU per review of the saturation rounds of "
      "this run (from /proc: the servers' own CPU, every thread). TLS and gunicorn are what any server on this "
      "stack pays (the allow-all too); the allow-all's app reads, parses and answers the body.")
    w("")
    if columns:
        header = " | ".join(f"{_NAMES.get(case.split('/')[1], case)} ({_BODIES[case.split('/')[0]][0]}) % / µs"
                            for case, _ in columns)
        w(f"| layer | {header} |")
        w("|---|" + "---:|" * len(columns))
        cpu = {case: _cpu_us(results, case) for case, _ in columns}
        for layer in layers.ORDER:
            if not any(r["shares"].get(layer) for _, r in columns):
                continue
            cells = []
            for case, r in columns:
                share = r["shares"].get(layer, 0.0)
                cells.append(f"{100 * share:.1f} / {share * cpu[case]:.0f}" if share else "-")
            w(f"| {layer} | {' | '.join(cells)} |")
        totals = " | ".join(f"{cpu[case]:.0f}, {r['busy']}" for case, r in columns)
        w(f"| CPU per review (µs), busy samples | {totals} |")
        w("")
    for case, why in skipped.items():
        w(f"* {case}: skipped ({why})")
    if skipped:
        w("")
    return out


def _cpu_us(results: dict[str, Any], case: str) -> float:
    body, name = case.split("/", 1)
    sat = results.get(_BODIES[body][1]) or {}
    return float(sat[name].med(lambda r: r.cpu_us_per_review)) if name in sat else 0.0


def _core_us(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("evaluate 3-container GPU pod"):
            return float(line.split()[-2])
    return 0.0

def _load(avg: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in avg) if avg else "?"

def _all_runs(results: dict[str, Any]) -> list[Any]:
    runs = []
    for group in ("saturation", "paced"):
        runs += [r for s in results[group].values() for r in s.runs]
    return runs
