"""Every command a user reads in README.md, CONTRIBUTING.md, the chart README, docs/ and the rendered NOTES
is one its tool accepts: helm and kubectl flags are in the command's own `--help`, make targets exist, the
modules `python -m` names exist, and each helm install or upgrade line renders as typed (placeholders
replaced by a value; `<overlay>` by every overlay). A failure names the file and line.

Running the commands against a cluster is tests/e2e/test_doc_commands.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from .doccommands import (
    CHART,
    NOTES_VARIANTS,
    ROOT,
    SUBSTITUTES,
    TOOLS,
    Command,
    doc_commands,
    expand_overlays,
    helm,
    make_targets,
    markdown_commands,
    notes_commands,
    parse,
    rendered_notes,
)

COMMANDS = doc_commands()
CLI = [c for c in COMMANDS if c.tool in ("helm", "kubectl")]
MAKE = [c for c in COMMANDS if c.tool == "make"]
PYTHON_MODULES = [c for c in COMMANDS if c.tool.endswith("python") and "-m" in c.words()]
HELM_RELEASE_LINES = [c for c in CLI if c.tool == "helm" and c.words()[1] in ("install", "upgrade")]
# Placeholders a runbook or a README uses for a human to fill in from what they see; no test types them.
DESCRIBED = {"<node>", "<pod from the alert>", "<device plugin pod on the node>", "<overlay>"}


def where(commands: list[Command]) -> list[str]:
    return [c.where for c in commands]


def check_flags(command: Command) -> None:
    parsed = parse(command)
    assert not parsed.unknown, (f"{command.where}: {' '.join(parsed.subcommand) or command.tool} has no flag "
                                f"{', '.join(parsed.unknown)} ({command.tool} {' '.join(parsed.subcommand)} "
                                f"--help): {command.text}")


def test_every_command_uses_a_tool_these_tests_know() -> None:
    unknown = [f"{c.where}: {c.text}" for c in COMMANDS if c.tool not in TOOLS]
    assert unknown == [], "commands of a tool nothing checks:\n" + "\n".join(unknown)


def test_every_placeholder_has_a_value_or_is_for_a_human() -> None:
    missing = [f"{c.where}: {p}" for c in COMMANDS for p in c.placeholders() if p not in {*SUBSTITUTES, *DESCRIBED}]
    assert missing == [], "placeholders without a substitute (tests/docs/doccommands.py SUBSTITUTES):\n" + \
        "\n".join(missing)


@pytest.mark.parametrize("command", CLI, ids=where(CLI))
def test_helm_and_kubectl_flags_exist(command: Command) -> None:
    check_flags(command)


@pytest.mark.parametrize("variant", NOTES_VARIANTS)
def test_the_notes_commands_flags_exist(variant: str) -> None:
    commands = notes_commands(rendered_notes(NOTES_VARIANTS[variant]), variant)
    assert any(c.words()[:2] == ["kubectl", "run"] for c in commands)
    for command in commands:
        check_flags(command)


@pytest.mark.parametrize("command", MAKE, ids=where(MAKE))
def test_make_targets_exist(command: Command) -> None:
    targets = [w for w in command.words()[1:] if not w.startswith("-") and "=" not in w]
    missing = [t for t in targets if t not in make_targets()]
    assert not missing, f"{command.where}: the Makefile has no target {', '.join(missing)}: {command.text}"


@pytest.mark.parametrize("command", PYTHON_MODULES, ids=where(PYTHON_MODULES))
def test_python_modules_exist(command: Command) -> None:
    words = command.words()
    module = words[words.index("-m") + 1]
    assert importlib.util.find_spec(module) is not None, f"{command.where}: no module {module}: {command.text}"


# What a Kubernetes 1.36 API server serves beyond Helm's defaults: the CEL admission policies (CEL mode).
SERVED = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
          "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
          "--api-versions", "resource.k8s.io/v1/DeviceClass")


def is_released_chart(word: str) -> bool:
    """oci://<registry>/charts/gpu-stack: a release's chart, `make release-publish` pushed it there."""
    return word.startswith("oci://") and word.endswith("/charts/gpu-stack")


def render_as_typed(words: list[str]) -> subprocess.CompletedProcess[str]:
    """A `helm install` or `helm upgrade` line as `helm template` of the same release, chart and values, as
    against a 1.36 API server (SERVED). --reuse-values has no release to reuse here, and the checks that
    need a cluster do not run: tests/e2e/test_doc_commands_live.py runs the lines against one."""
    args = [a for a in words[2:] if a not in ("--reuse-values", "--install", "--create-namespace")]
    if any(is_released_chart(a) for a in args):  # this chart, packaged (tests/release/test_release.py)
        at = args.index("--version")
        args = [str(CHART) if is_released_chart(a) else a for a in args[:at] + args[at + 2:]]
    argv = [helm(), "template", *args, *SERVED]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize("command", HELM_RELEASE_LINES, ids=where(HELM_RELEASE_LINES))
def test_install_and_upgrade_lines_render_as_typed(command: Command) -> None:
    for overlay, words in expand_overlays(command.typed()):
        proc = render_as_typed(words)
        with_overlay = f" (<overlay> = {overlay})" if overlay else ""
        assert proc.returncode == 0, f"{command.where}{with_overlay}: {command.text}\n{proc.stderr}"


def test_the_install_lines_cover_every_overlay() -> None:
    overlays = {name for c in HELM_RELEASE_LINES for name, _ in expand_overlays(c.typed()) if name}
    assert overlays == {p.stem for p in (CHART / "examples").glob("*.yaml")}


# ---- the checks themselves -------------------------------------------------------------------------------


def test_a_misspelt_flag_is_reported_with_its_file_and_line(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text("Install:\n\n```console\nhelm install gpu-stack charts/gpu-stack \\\n"
                   "  --namespce gpu-stack\nkubectl get pods -n gpu-stack\n```\n", encoding="utf-8")
    install, get = markdown_commands(doc)
    assert (install.where, get.where) == (f"{doc}:4", f"{doc}:6")
    assert install.text == "helm install gpu-stack charts/gpu-stack --namespce gpu-stack"
    with pytest.raises(AssertionError, match=rf"{doc}:4: install has no flag --namespce"):
        check_flags(install)
    check_flags(get)


def test_kubectl_global_flags_before_the_subcommand_are_understood() -> None:
    command = Command("x.md", 1, "kubectl -n gpu-stack get pods -l app=x -o wide")
    parsed = parse(command)
    assert parsed.subcommand == ("get",) and parsed.unknown == []


def test_example_blocks_count_only_their_prompted_lines(tmp_path: Path) -> None:
    doc = tmp_path / "example.md"
    doc.write_text("```console\n$ kubectl apply -f pod.yaml\nError from server (Forbidden): no\n```\n",
                   encoding="utf-8")
    (command,) = markdown_commands(doc)
    assert command.text == "kubectl apply -f pod.yaml" and command.example


def test_a_placeholder_without_a_value_names_the_line() -> None:
    with pytest.raises(LookupError, match=r"x.md:7: no substitute for <cluster>"):
        Command("x.md", 7, "kubectl config use-context <cluster>").typed()
