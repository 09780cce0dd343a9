"""Render the results of bench/run_bench.py as BENCHMARKS.md (figures, ratios, targets met or missed).

The file is made of marked sections (`<!-- name:begin (writer) -->` ... `<!-- name:end -->`), each
stamped with the run that wrote it (provenance.stamp: date, commit, command), under a frame this module
writes: the title, how the file is made, the method, and a block (refresh_sources, rewritten by every
writer) with the table of parts and their runs, the parts missing, every target with its verdict, and,
when any part measured a checkout with uncommitted changes, a warning saying so at the top (a test refuses
such a file in a commit). bench/run_bench.py writes the whole file anew: the frame, its own section, then
the files it includes (bench/soak.md from `make soak`, bench/inspect-scale.md from `make bench-inspect`,
each labelled with the commit that last changed it); of the old file it keeps only the marked sections
other scripts wrote (PARTS), which carry their own stamps. Nothing else survives a run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpu_stack_dev import paths
from gpu_stack_dev.bench import provenance, targets

INSPECT_SCALE = paths.BENCH / "inspect-scale.md"


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _lat(summary: Any, key: str) -> float:
    return float(summary.med(lambda r: r.latency_us[key]))


TITLE = "# Benchmarks"
# The marked sections `make bench` writes, in the order it writes them, and who writes each.
PARTS = {
    "http": "bench/run_bench.py",
    "soak": "make soak (bench/soak.md, included)",
    "inspect-scale": "make bench-inspect (bench/inspect-scale.md, included)",
    "many-clients": "bench/many_clients.py",
    "apiserver-load": "bench/apiserver_load.py --part load",
    "apiserver-calls": "bench/apiserver_load.py --part calls",
    "scheduler-scale": "bench/scheduler_scale.py",
    "pod-startup": "bench/pod_startup.py (as root, on a real node)",
}
DIRTY = "+ uncommitted changes"
DIRTY_WARNING = ("**Not reproducible: a part of this file measured a checkout with uncommitted changes** (its run "
                 "below says `" + DIRTY + "`). Commit the code, run `make bench` again, and commit the file it "
                 "writes; tests/bench/test_bench_report.py refuses this file in a commit.")
INTRO = ("Written whole by `make bench` (hack/bench_policy.py and bench/run_bench.py, then bench/many_clients.py, "
         "bench/apiserver_load.py, bench/scheduler_scale.py and bench/pod_startup.py; `make soak` and "
         "`make bench-inspect` write the parts "
         "it includes). Do not edit it by hand: each part says which run wrote it, on which commit. The history of "
         "how the review path got to these figures is in git (`git log -p -- BENCHMARKS.md bench/analysis.md`).")
METHOD = [
    "## Method",
    "",
    "* The machine is the project's shared 2-CPU VM: other work runs beside the bench, so absolute figures move "
    "from run to run. The servers are measured in alternating rounds, and the ratios (same run, same noise) are "
    "the figures to compare; CPU per review (from /proc, so it counts neither the load generator nor other "
    "tenants) is the steadiest figure. Each part names its machine, load and rounds.",
    "* Closed-loop latency at saturation is queueing, not service time; the latency the API server sees is the "
    "fixed-rate one.",
    "* Load: wrk with a Lua script (bench/mix.lua) that paces sends on a fixed schedule where a fixed rate is "
    "wanted (Debian's wrk has no constant-rate mode) and counts sends that missed their slot, so queueing is not "
    "hidden (coordinated omission).",
    "* Targets are judged in every round of the run that wrote the part, not on an average of runs.",
    "",
]
HTTP_BEGIN, HTTP_END = "<!-- http:begin (bench/run_bench.py) -->", "<!-- http:end -->"
# Rewritten by refresh_sources whenever a part changes: the warning (dirty runs), the targets, the parts.
SOURCES_BEGIN, SOURCES_END = "<!-- sources:begin (bench/report.py) -->", "<!-- sources:end -->"
TARGETS_BEGIN, TARGETS_END = "<!-- targets-summary:begin (bench/report.py) -->", "<!-- targets-summary:end -->"
PARTS_BEGIN, PARTS_END = "<!-- parts:begin (bench/report.py) -->", "<!-- parts:end -->"
_GENERATED = provenance.GENERATED


def frame_lines() -> list[str]:
    """The head of the file, above the parts: title, the warning block, how the file is made, the method, the
    targets and the parts (the blocks are filled by refresh_sources)."""
    return [TITLE, "", SOURCES_BEGIN, SOURCES_END, "", INTRO, "", *METHOD, TARGETS_BEGIN, TARGETS_END, "",
            PARTS_BEGIN, PARTS_END, ""]


def _included(name: str, writer: str, path: Path, what: str) -> list[str]:
    """A kept file as a marked section; its own `Run:` line (if its writer stamps it) names the run,
    else a line says which file and commit it comes from."""
    text = path.read_text(encoding="utf-8").rstrip()
    origin = provenance.file_origin(path)
    has_stamp = any(line.strip().strip("*").startswith(provenance.STAMP_PREFIX) for line in text.splitlines())
    note = f"*Included from {origin}.*" if has_stamp else f"*{provenance.STAMP_PREFIX}{what}; {origin}.*"
    begin, end = f"<!-- {name}:begin ({writer}) -->", f"<!-- {name}:end -->"
    if text.startswith(f"<!-- {name}:begin"):  # the file carries its own markers
        begin, text = text.split("\n", 1)
        text = text.removesuffix(end).rstrip()
    heading, _, rest = text.partition("\n")
    return [begin, heading, "", note, rest.rstrip(), end, ""]


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
      "env vars, bench/bodies.py `gpu_pod_3c`; on /mutate with the MPS annotation, so the answer is patched): "
      "every review then hits the webhook's diff memo and last-encoded-patch cache, the best case. The bare "
      "allow-all gets the bodies /validate gets. Rules sweep: the five recorded cases of bench/bodies.py `mix` "
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

    # --- profile ----------------------------------------------------------------------------------
    prof = results.get("profile")
    if prof:
        w("## Profile of a webhook worker under load (this run)")
        w("")
        if "skipped" in prof:
            w(f"Skipped: {prof['skipped']}")
        else:
            w(f"py-spy `record --gil` (samples only the thread holding the GIL, i.e. Python CPU time) on both "
              f"workers while wrk saturates /validate with the pod mix: {prof['busy_samples']} samples. "
              "Inclusive share of gunicorn's request handling and of every frame of our package above 2 % "
              "(orjson's parse and serialise are native code, so they count in their caller's self time):")
            w("")
            w("| frame | inclusive % | self % |")
            w("|---|---:|---:|")
            for frame, own, incl in prof["inclusive"]:
                if frame.startswith(_GUNICORN) or (frame.split("(")[-1].startswith(_OURS) and incl >= 2.0):
                    w(f"| `{frame}` | {incl:.1f} | {own:.1f} |")
            w("")
            w("Top self time: " + "; ".join(f"`{f}` {pct:.1f} %" for f, pct in prof["self"][:8]) + ".")
        w("")

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
        out.extend(_included("soak", "make soak: bench/soak.md", targets.SOAK, "`make soak` (its date is below)"))
    if INSPECT_SCALE.is_file():  # written by `make bench-inspect` (bench/inspect_scale.py), kept here
        out.extend(_included("inspect-scale", "make bench-inspect: bench/inspect-scale.md", INSPECT_SCALE,
                             "`make bench-inspect` (its date is below)"))
    return refresh_sources("\n".join(out))


def mix_text(mix: dict[str, Any]) -> str:
    """One sentence on the pod mix, from bodies.describe (what was sent, counted)."""
    if not mix:
        return "Headline and targets: the pod mix of bench/bodies.py `pod_mix`."
    kinds = {"none": "without GPU", "gpu": "whole GPUs", "mps": "MPS", "mig": "MIG slices"}
    shares = ", ".join(f"{k['share']:.0%} {kinds.get(name, name)} ({k['shapes']} shapes)"
                       for name, k in mix["by_kind"].items())
    denied = ", ".join(f"{shape} ({rule})" for shape, rule in mix.get("denied_by", {}).items())
    patches = (f"; the /mutate answers carry {mix['distinct_patches']} distinct JSONPatches"
               if "distinct_patches" in mix else "")
    return (f"Headline and targets: the pod mix (bench/bodies.py `pod_mix`): {mix['bodies']:,} pod CREATE reviews "
            f"of {mix['shapes']} distinct shapes, {mix['bytes'] / 1024:.1f} KiB on average, sent in a fixed "
            f"shuffled order: {shares}. Each starts from the review the API server sent for a pod its ReplicaSet "
            "controller created, with its own uid, and mix.lua writes a serial into the uid (and on /validate "
            "the pod name and uid) on every send, so no two requests of a run share them. Most pods of a "
            "cluster have no GPU; the mix is GPU-heavier than a typical cluster on purpose (a GPU pod costs the "
            "webhook more, and with matchConditions the webhook is sent mostly GPU pods). "
            f"/validate denies {mix['denied']} of them ({mix['denied'] / max(1, mix['bodies']):.1%}: {denied}); "
            f"/mutate patches {mix['patched']} ({mix['patched'] / max(1, mix['bodies']):.0%}){patches}.")


# Frames shown in the profile table: gunicorn's request handling, and our package's subpackages as
# profile_summary shortens them ("review (admission/decide.py)"), whatever the functions are called.
_GUNICORN = ("ThreadWorker.handle (", "Parser.__next__", "ThreadWorker.handle_request")
_OURS = ("admission/", "policy/", "rules/", "server/", "kube/", "gpu_stack_webhook/")


def _core_us(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("evaluate 3-container GPU pod"):
            return float(line.split()[-2])
    return 0.0


_SECTION = re.compile(r"<!-- (?P<name>[\w-]+):begin[^>]*-->.*?<!-- (?P=name):end -->", re.DOTALL)


def keep_sections(old: str, new: str) -> str:
    """`new` with the marked sections of `old` it lacks appended (bench/many_clients.py and
    bench/apiserver_load.py write theirs between markers after this report; a run of this script alone
    keeps them, and their stamps say which run they are from). Nothing else of `old` is kept."""
    kept = [m.group(0) for m in _SECTION.finditer(old)
            if m.group("name") not in _GENERATED and m.group("name") != "analysis"
            and f"<!-- {m.group('name')}:begin" not in new]
    return refresh_sources("\n\n".join([new.rstrip("\n"), *kept]) + "\n")


def refresh_sources(text: str) -> str:
    """`text` with its generated blocks rewritten from its parts: at the top the warning when a part measured
    uncommitted changes (else nothing); the targets and their verdicts; the table of parts and their runs,
    and the parts `make bench` writes that the file lacks."""
    if SOURCES_BEGIN not in text or SOURCES_END not in text:
        return text
    parts = provenance.sources(text)
    warning = [DIRTY_WARNING] if any(DIRTY in run for _, run in parts) else []
    text = _replace_block(text, SOURCES_BEGIN, SOURCES_END, warning)
    if TARGETS_BEGIN in text and TARGETS_END in text:
        rows = ["## Targets and verdicts", "", "| part | target | verdict |", "|---|---|---|"]
        rows += [f"| {part} | {target} | {verdict} |" for part, target, verdict in targets_of(text)]
        text = _replace_block(text, TARGETS_BEGIN, TARGETS_END, rows)
    if PARTS_BEGIN in text and PARTS_END in text:
        rows = ["## Where each part of this file comes from", "",
                "| part | run (date, commit measured, command) |", "|---|---|"]
        rows += [f"| {heading} | {run} |" for heading, run in parts]
        present = {m.group("name") for m in _SECTION.finditer(text)}
        missing = [f"{name} ({writer})" for name, writer in PARTS.items() if name not in present]
        if missing:
            rows += ["", "Not in this file yet (the next `make bench` writes them): " + "; ".join(missing) + "."]
        text = _replace_block(text, PARTS_BEGIN, PARTS_END, rows)
    return text


def _replace_block(text: str, begin: str, end: str, lines: list[str]) -> str:
    head, rest = text.split(begin, 1)
    body = "\n".join(lines)
    return head + begin + ("\n" + body if body else "") + "\n" + end + rest.split(end, 1)[1]


_VERDICT = re.compile(r"^(?P<target>.*?):\s*(?P<verdict>\*\*not met\*\*|not met|met)(?!\w)(?P<rest>.*)$")


def targets_of(text: str) -> list[tuple[str, str, str]]:
    """(part, target, verdict) for every target the parts judge: the rows of their `| target | ... | result |`
    tables, and their `Target...: ... met / **not met** (...)` lines."""
    found: list[tuple[str, str, str]] = []
    for m in _SECTION.finditer(text):
        if m.group("name") in _GENERATED:
            continue
        part = ""
        header: list[str] | None = None
        for line in m.group(0).splitlines():
            if line.startswith("## "):
                part = line[3:].strip()
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
            if cells is None:
                header = None
                if line.startswith("Target"):
                    target, _, judged = line.partition(": ")
                    verdict = _VERDICT.match(judged)
                    if verdict:
                        qualifier = target.removeprefix("Target").strip(" ,")
                        judged_target = verdict.group("target")
                        if qualifier:
                            judged_target = f"{qualifier}: {judged_target}"
                        said = f"{verdict.group('verdict')}{verdict.group('rest')}".split(". ", 1)[0].rstrip(".")
                        found.append((part, judged_target.strip(), said.strip()))
                continue
            if header is None:
                header = [c.lower() for c in cells]
                continue
            if set("".join(cells)) <= set("-: "):
                continue
            if header and header[0] == "target" and header[-1] in ("result", ""):
                found.append((part, cells[0], cells[-1] or cells[-2]))
    return found


def write_section(path: Path, section: str, begin: str, end: str) -> None:
    """Put `section` (which starts with `begin` and ends with `end`) into the file, replacing the old one,
    and refresh the table of parts."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(refresh_sources(text), encoding="utf-8")


def _load(avg: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in avg) if avg else "?"


def _all_runs(results: dict[str, Any]) -> list[Any]:
    runs = []
    for group in ("saturation", "paced"):
        runs += [r for s in results[group].values() for r in s.runs]
    return runs
