"""A small Pod Security Standards checker (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
the policies as of Kubernetes v1.30+), for the pod templates the chart renders.

`check(pod_spec, annotations)` returns the violated checks as (level, check, detail); a pod meets
`restricted` with none, `baseline` with no baseline ones, else only `privileged`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret", "image"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

Violation = tuple[str, str, str]  # (level, check, detail)


def containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or []


def check(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> list[Violation]:
    out: list[Violation] = []
    psc = spec.get("securityContext") or {}

    def base(check_name: str, detail: str) -> None:
        out.append(("baseline", check_name, detail))

    def restr(check_name: str, detail: str) -> None:
        out.append(("restricted", check_name, detail))

    # --- baseline ---
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        base("hostProcess", "pod windowsOptions.hostProcess")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            base("host namespaces", flag)
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            base("hostPath volumes", f"{volume['name']}: {volume['hostPath'].get('path')}")
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            restr("volume types", f"{volume['name']}: {', '.join(sorted(kinds))}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            base("sysctls", str(sysctl.get("name")))
    for key, value in (annotations or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default" and not value.startswith("localhost/"):
            base("AppArmor", f"{key}={value}")
    owners = [("pod", psc)] + [(c.get("name", "?"), c.get("securityContext") or {}) for c in containers(spec)]
    for sc_owner, sc in owners:
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            base("AppArmor", f"{sc_owner}: appArmorProfile {apparmor}")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            base("SELinux", f"{sc_owner}: seLinuxOptions {selinux}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            base("seccomp", f"{sc_owner}: Unconfined")
    for c in containers(spec):
        name, sc = c.get("name", "?"), c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            base("hostProcess", name)
        if sc.get("privileged"):
            base("privileged", name)
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            base("capabilities", f"{name}: adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            base("hostPorts", name)
        if sc.get("procMount") not in (None, "Default"):
            base("/proc mount", f"{name}: {sc['procMount']}")
        # --- restricted ---
        if sc.get("allowPrivilegeEscalation") is not False:
            restr("privilege escalation", f"{name}: allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            restr("runAsNonRoot", name)
        if sc.get("runAsUser", psc.get("runAsUser")) == 0 or psc.get("runAsUser") == 0:
            restr("runAsUser", f"{name}: 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            restr("seccomp", f"{name}: {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            restr("capabilities", f"{name}: does not drop ALL")
        if added - {"NET_BIND_SERVICE"}:
            restr("capabilities", f"{name}: adds {sorted(added - {'NET_BIND_SERVICE'})}")
    return out


def level(violations: list[Violation]) -> str:
    if not violations:
        return "restricted"
    return "privileged" if any(lvl == "baseline" for lvl, _, _ in violations) else "baseline"
