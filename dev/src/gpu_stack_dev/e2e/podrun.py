"""Run a chart container as its pod would, without a kubelet: the installed Deployment's command, args and
env, its volumes mounted where the pod mounts them, as the user its securityContext names.

No container can run on the e2e machines, so `ChartContainer` does here what a container runtime does for
the parts the process can tell apart (tests/e2e/test_tls_selfmanaged.py):

- a private mount namespace (`unshare --mount`): each volumeMount's source (a ConfigMap's keys as files,
  an emptyDir) bound at its mountPath, read-only where the mount says so; the working tree (with the
  venv the image's /opt/venv stands for) read-only, so only the writable volumes (the chart's /tmp
  emptyDir, the TLS emptyDir) take writes;
- the ServiceAccount token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount and
  KUBERNETES_SERVICE_HOST/PORT, as the kubelet gives a pod whose token is mounted (in-cluster config);
- the image's environment (webhook/Dockerfile: PATH to the venv, PYTHONDONTWRITEBYTECODE,
  PYTHONUNBUFFERED), then the container's `env`;
- `setpriv` to runAsUser/runAsGroup with no supplementary groups, no capabilities and no_new_privs
  (allowPrivilegeEscalation: false, capabilities drop ALL);
- cwd `/`, the image's working directory;
- the Python interpreter reachable by that user, as it is in the image (_reachable_interpreter).

One substitution: the pod has its own network namespace, so the address `--bind` names (0.0.0.0:8443)
becomes 127.0.0.1 and a free port here; every other argument is the Deployment's, as rendered.
Mount points that do not exist on this machine are created as empty directories and removed afterwards.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gpu_stack_dev import controlplane
from gpu_stack_dev.paths import ROOT

from .e2elib import E2ECluster

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# webhook/Dockerfile, runtime stage: ENV (PATH's venv is the repo's, which the image's /opt/venv stands for).
IMAGE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


class ChartContainer:
    def __init__(self, cluster: E2ECluster, deployment: dict[str, Any], workdir: Path, *,
                 container: str = "webhook", serviceaccount: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.pod = deployment["spec"]["template"]["spec"]
        self.namespace = deployment["metadata"]["namespace"]
        self.container = next(c for c in self.pod["containers"] if c["name"] == container)
        self.serviceaccount = serviceaccount or self.pod.get("serviceAccountName", "default")
        self.workdir = workdir
        self.extra_args = extra_args
        self.port = controlplane.free_port()
        self.log_path = workdir / "container.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.created: list[Path] = []
        self.mounts: dict[str, Path] = {}  # mountPath -> host directory

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def host_path(self, mount_path: str) -> Path:
        """Where this machine holds what the container sees at `mount_path` (a volume's directory)."""
        return self.mounts[mount_path]

    def args(self) -> list[str]:
        args = list(self.container.get("args", []))
        if "--bind" in args:
            args[args.index("--bind") + 1] = f"127.0.0.1:{self.port}"
        return [*args, *self.extra_args]

    def _user(self) -> tuple[int, int]:
        context = {**self.pod.get("securityContext", {}), **self.container.get("securityContext", {})}
        return int(context["runAsUser"]), int(context.get("runAsGroup", context["runAsUser"]))

    def _volume_dir(self, volume: dict[str, Any], uid: int, gid: int) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{volume['name']}-", dir=self.workdir))
        if "configMap" in volume:
            data = self.cluster.get_json("configmap", volume["configMap"]["name"], "-n", self.namespace)["data"]
            for key, value in data.items():
                (path / key).write_text(value)
        elif "emptyDir" not in volume:
            raise AssertionError(f"volume {volume['name']}: only configMap and emptyDir are mounted here")
        os.chown(path, uid, gid)
        path.chmod(0o755)
        return path

    def _token_dir(self) -> Path:
        path = self.workdir / "serviceaccount"
        path.mkdir()
        token = self.cluster.kubectl("create", "token", self.serviceaccount, "-n", self.namespace,
                                     "--duration=1h").stdout.strip()
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        server = admin["clusters"][0]["cluster"]
        (path / "token").write_text(token)
        (path / "namespace").write_text(self.namespace)
        ca = server.get("certificate-authority")
        (path / "ca.crt").write_bytes(Path(ca).read_bytes() if ca else __import__("base64").b64decode(
            server["certificate-authority-data"]))
        return path

    def _env(self) -> dict[str, str]:
        server = yaml.safe_load(self.cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        host, port = server.removeprefix("https://").rsplit(":", 1)
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", **IMAGE_ENV,
               "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
        for item in self.container.get("env", []):
            if "value" not in item:
                raise AssertionError(f"env {item['name']}: only literal values are set here")
            env[item["name"]] = item["value"]
        return env

    def _hold(self) -> Path:
        """An empty directory outside every volume's mountPath (/dev/shm, a tmpfs the pod never mounts)."""
        path = Path(tempfile.mkdtemp(prefix="podrun-hold-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        self.created.append(path)
        return path

    def _reachable_interpreter(self, uid: int) -> list[str]:
        """The image's Python is readable by its user; this machine's may sit under a directory only root
        may enter (pyenv in /root). Then that directory is covered by an empty one that anyone may enter,
        holding only the interpreter's tree (commands run inside the mount namespace)."""
        real = Path(os.path.realpath(sys.executable))
        for closed in real.parents:
            if closed.stat().st_mode & 0o001 == 0 and closed != Path("/"):
                break
        else:
            return []
        if uid == 0:
            return []
        child = closed / real.relative_to(closed).parts[0]
        hold = self.workdir / "interpreter"
        hold.mkdir()
        return [f"mount --bind {shlex.quote(str(child))} {shlex.quote(str(hold))}",
                f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(closed))}",
                f"mkdir {shlex.quote(str(child))}",
                f"mount --bind {shlex.quote(str(hold))} {shlex.quote(str(child))}"]

    def start(self) -> ChartContainer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        uid, gid = self._user()
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        binds: list[tuple[Path, str, bool]] = []
        for mount in self.container.get("volumeMounts", []):
            source = self._volume_dir(volumes[mount["name"]], uid, gid)
            self.mounts[mount["mountPath"]] = source
            binds.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
        if self.pod.get("automountServiceAccountToken", True):
            binds.append((self._token_dir(), TOKEN_DIR, True))
        # /tmp last: the other sources live under it on this machine.
        binds.sort(key=lambda b: b[1] == "/tmp")
        for _, target, _ in binds:
            for parent in reversed([Path(target), *Path(target).parents]):
                if not parent.exists():
                    parent.mkdir()
                    self.created.append(parent)
        root = shlex.quote(str(ROOT))
        # The working tree (and its venv) may sit under a path a volume covers (a checkout in /tmp): it is
        # held at a place no volume covers and bound back at its own path once the volumes are in place.
        covered = any(Path(t) == ROOT or Path(t) in ROOT.parents for _, t, _ in binds)
        hold = shlex.quote(str(self._hold())) if covered else ""
        script = self._reachable_interpreter(uid)
        script += [f"mount --bind {root} {root}", f"mount -o remount,bind,ro {root}"]
        if covered:
            script.append(f"mount --bind {root} {hold}")
        for source, target, read_only in binds:
            script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
            if read_only:
                script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        if covered:
            script += [f"mkdir -p {root}", f"mount --bind {hold} {root}", f"mount -o remount,bind,ro {root}"]
        command = [*self.container["command"], *self.args()]
        script.append("cd / && exec setpriv --reuid {} --regid {} --clear-groups --no-new-privs --inh-caps=-all "
                      "--bounding-set=-all -- env -i {} {}".format(
                          uid, gid, " ".join(shlex.quote(f"{k}={v}") for k, v in self._env().items()),
                          " ".join(shlex.quote(a) for a in command)))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-ec", " && ".join(script)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # gunicorn's quick shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for path in reversed(self.created):
            path.rmdir()
        self.created.clear()
