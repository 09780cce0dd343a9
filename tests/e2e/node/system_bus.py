"""Stand-in for a GPU node's system D-Bus: Debian's dbus-daemon listening on /run/dbus/system_bus_socket, with no
systemd behind it. The MIG manager v0.15.0 connects to `<host root>/run/dbus/system_bus_socket` before every
reconfiguration, whatever it will ask systemd (mig-parted pkg/mig/reconfigure/reconfigure.go `New`, v0.15.0);
this machine runs no system bus. The socket lives in a directory of the node bound over /run/dbus in this run's
own mount namespace only (hack/netns.py), so the machine's /run/dbus is untouched."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .standin import wait_for

BUS_DIR = Path("/run/dbus")
SOCKET = BUS_DIR / "system_bus_socket"
# any uid may connect and call anything: the MIG manager's sandbox (gVisor) connects through the host's socket
CONFIG = f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={SOCKET}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


@contextmanager
def bus_directory(real_node: Any) -> Iterator[Path]:
    """The node's directory bound over /run/dbus, before the pods start: a hostPath volume is a private mount, so
    a pod sees only what was mounted on the host when it started, and a GPU node's bus is there at boot."""
    here = real_node.dir / "system-bus"
    (here / "run").mkdir(parents=True, exist_ok=True)
    BUS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(here / "run"), str(BUS_DIR)], check=True)
    try:
        yield here
    finally:
        subprocess.run(["umount", str(BUS_DIR)], check=False)


@contextmanager
def system_bus(here: Path) -> Iterator[Path]:
    """dbus-daemon listening in the directory `bus_directory` gave."""
    (here / "system.conf").write_text(CONFIG)
    with open(here / "dbus-daemon.log", "ab") as log:
        daemon = subprocess.Popen(["dbus-daemon", f"--config-file={here / 'system.conf'}", "--nofork",
                                   "--nopidfile"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: SOCKET.is_socket() or daemon.poll() is not None, f"dbus-daemon listening on {SOCKET}")
        if daemon.poll() is not None:
            raise AssertionError(f"dbus-daemon exited: {(here / 'dbus-daemon.log').read_text()}")
        yield SOCKET
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        SOCKET.unlink(missing_ok=True)
