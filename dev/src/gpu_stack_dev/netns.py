"""Run a command in a network and mount namespace of its own, and leave nothing behind.

    python hack/netns.py run -- CMD [ARG...]

`make e2e` runs its tests this way (as root), so that the real node some of them start (gpu_stack_dev.node:
kubelet, containerd, gVisor sandboxes, a CNI bridge, kube-proxy's iptables rules) and every control plane
listen and dial only inside a namespace this run created, never in the machine's own:
- a new network namespace with only `lo` (up): loopback traffic stays in it, the pods' namespaces hang off
  a bridge inside it;
- a new mount namespace with private propagation: the node's mounts (pod volumes, container root
  filesystems, CNI network namespace files) exist only there.
When CMD ends, or this wrapper is interrupted (Ctrl-C, SIGTERM), every process still in the network
namespace (containerd shims, gVisor sandboxes) is killed; the kernel then frees both namespaces, and with
them every mount, bridge and iptables rule. CMD sees GPU_STACK_E2E_NETNS set to the machine's own network
namespace (as /proc/self/ns/net names it), so it can tell that it runs elsewhere (`inside()`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER = "GPU_STACK_E2E_NETNS"


def can_isolate() -> str:
    """Empty when this process can make the namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root (the namespaces and a real node need root)"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return ""


def inside() -> bool:
    """True in a process that hack/netns.py started in a namespace of its own."""
    outer = os.environ.get(MARKER, "")
    try:
        return bool(outer) and os.readlink("/proc/self/ns/net") != outer
    except OSError:
        return False


# The machine's paths that the node's pods (the chart's hostPath volumes, with the chart's defaults) and NVIDIA's
# binaries write to: the kubelet's fixed device plugin directory and the DRA plugin directories under it, the
# toolkit's runtime config and socket defaults, CDI specs (the plugin's and the toolkit's), the driver root, MPS and
# validation directories under /run/nvidia, the toolkit's default install directory, and GFD/NFD's features.d.
# /var/run is /run on Debian. `private_paths` gives a run its own, empty, of each; .ci/run hides the same ones.
HOST_PATHS = ("/var/lib/kubelet", "/etc/containerd", "/run/containerd", "/run/cdi", "/etc/cdi", "/run/nvidia",
              "/usr/local/nvidia", "/etc/kubernetes")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _shadow(parent: Path) -> None:
    """A tmpfs over `parent` holding a bind mount of each of its entries (symlinks copied): what was there stays,
    and writes to it still reach the machine's files; a new entry is this mount namespace's alone."""
    staging = Path(tempfile.mkdtemp(prefix="gpu-stack-shadow-"))
    try:
        _mount("-t", "tmpfs", "-o", f"mode={parent.stat().st_mode & 0o7777:o}", "tmpfs", str(staging))
        try:
            for entry in parent.iterdir():
                target = staging / entry.name
                if entry.is_symlink():
                    target.symlink_to(os.readlink(entry))
                    continue
                target.mkdir() if entry.is_dir() else target.touch()
                _mount("--rbind", str(entry), str(target))
            _mount("--move", str(staging), str(parent))
            _mount("--make-shared", str(parent))
        except BaseException:
            subprocess.run(["umount", "-l", str(staging)], check=False, capture_output=True)
            raise
    finally:
        staging.rmdir()


def private_paths(paths: tuple[str, ...] = HOST_PATHS) -> None:
    """An empty directory of this mount namespace's own at each of `paths`, in a process that `run` started
    (inside(): its mount namespace is private), and nothing created on the machine's filesystem: a tmpfs over a
    path that exists; for one that does not, its nearest existing parent is shadowed (_shadow) and the path made
    in the shadow. Each tmpfs is a shared mount, as a GPU node's systemd makes every mount: containerd refuses a
    HostToContainer volume (the toolkit's /run/nvidia/validations) from a private one (`is mounted on "/run/nvidia"
    but it is not a shared or slave mount`)."""
    if not inside():
        raise RuntimeError("private host paths only in a mount namespace of this run's own (hack/netns.py run)")
    absent: dict[Path, list[Path]] = {}
    for path in map(Path, paths):
        if path.is_dir() and not path.is_symlink():
            if os.path.ismount(path):  # hack/fresh-host.sh's tmpfs, made private by `run`: containerd reads that one
                _mount("--make-shared", str(path))
            _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path))
            _mount("--make-shared", str(path))
            continue
        parent = path.parent
        while not parent.is_dir():
            parent = parent.parent
        absent.setdefault(parent, []).append(path)
    for parent, under in absent.items():
        if os.path.ismount(parent):
            _mount("--make-shared", str(parent))
        _shadow(parent)
        for path in under:
            path.mkdir(parents=True, exist_ok=True)


def processes_in(netns: str) -> list[int]:
    """The pids whose network namespace is `netns` (a /proc/PID/ns/net link text, e.g. net:[4026532])."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "net") == netns:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def kill_all_in(netns: str) -> None:
    for _ in range(50):
        pids = [p for p in processes_in(netns) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def run(cmd: list[str]) -> int:
    why = can_isolate()
    if why:
        print(f"netns: cannot isolate: {why}", file=sys.stderr)
        return 2
    # unshare --fork: CMD is pid-parented by unshare; --kill-child: CMD dies with unshare.
    inner = ["unshare", "--net", "--mount", "--propagation", "private", "--fork", "--kill-child", "--",
             "sh", "-c", 'ip link set lo up && exec "$@"', "netns", *cmd]
    child = subprocess.Popen(inner, env={**os.environ, MARKER: os.readlink("/proc/self/ns/net")})
    netns = ""
    for _ in range(100):  # the namespace of unshare's child, once it exists
        try:
            children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
            if children:
                netns = os.readlink(f"/proc/{children[0]}/ns/net")
                if netns != os.readlink("/proc/self/ns/net"):
                    break
                netns = ""
        except OSError:
            pass
        if child.poll() is not None:
            break
        time.sleep(0.05)

    def stop(signum: int, _frame: object) -> None:
        child.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if netns:
            kill_all_in(netns)
    return code


def fresh(cmd: list[str]) -> int:
    """CMD in a mount namespace of its own where each of HOST_PATHS that exists on the machine is an empty tmpfs,
    and each that does not stays absent: what earlier runs left there cannot help CMD (.ci/run runs the suites so).
    Only a mount namespace: CMD keeps the machine's network (package registries), and its writes elsewhere (a
    package install) reach the machine's files. Nothing else is shadowed, so an install that writes into one of
    HOST_PATHS (containerd's /etc/containerd/config.toml, on a machine that already has it) writes to the tmpfs."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("fresh: needs root and unshare (a mount namespace of its own)", file=sys.stderr)
        return 2
    script = ('for p in $GPU_STACK_FRESH_PATHS; do if [ -d "$p" ] && [ ! -L "$p" ]; then '
              'mount -t tmpfs -o mode=0755 tmpfs "$p" || exit 2; fi; done; exec "$@"')
    os.environ["GPU_STACK_FRESH_PATHS"] = " ".join(HOST_PATHS)
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "fresh", *cmd])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netns.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="exit 0 when this process can make the namespaces, else say why")
    runner = sub.add_parser("run", help="run CMD in new network and mount namespaces")
    runner.add_argument("cmd", nargs=argparse.REMAINDER)
    fresh_runner = sub.add_parser("fresh", help="run CMD with the machine's HOST_PATHS hidden (a mount namespace only)")
    fresh_runner.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "check":
        why = can_isolate()
        print(why or "ok")
        return 1 if why else 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error(f"{args.command} needs a command after --")
    return fresh(cmd) if args.command == "fresh" else run(cmd)


if __name__ == "__main__":
    sys.exit(main())
