"""Whether each gunicorn worker may bind a listening socket of its own (SO_REUSEPORT), decided once in the
master before any worker is forked.

With `reuse_port`, gunicorn 27 has every worker bind the address itself (arbiter.py `spawn_worker` calls
`sock.create_sockets` in the child). Where the runtime refuses a second SO_REUSEPORT bind of one port (gVisor
does: its netstack answers EADDRINUSE), the second worker could not bind, exited, and was forked again for as
long as the pod ran. So the master first binds two SO_REUSEPORT sockets to one ephemeral port on the host it
will serve; when the second bind is refused the workers share the master's one listening socket instead (what
gunicorn does without `reuse_port`) and one log line says so.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket

log = logging.getLogger("gpu_stack_webhook.server")

FALLBACK_MESSAGE = ("SO_REUSEPORT: a second bind of one port is refused here (%s); the workers share one "
                    "listening socket")


def _family_and_host(bind: str) -> tuple[socket.AddressFamily, str]:
    host = bind.rpartition(":")[0] if ":" in bind else bind
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, host[1:-1]
    return socket.AF_INET, host or "0.0.0.0"  # noqa: S104  (the address gunicorn is about to bind)


def reuse_port_works(bind: str) -> bool:
    """True when two sockets with SO_REUSEPORT can bind one port of `bind`'s host (a unix socket or a
    platform without SO_REUSEPORT: False, gunicorn's shared listener)."""
    if bind.startswith("unix:") or not hasattr(socket, "SO_REUSEPORT"):
        return False
    family, host = _family_and_host(bind)
    with contextlib.ExitStack() as stack:
        try:
            first = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            first.bind((host, 0))
            port = first.getsockname()[1]
            second = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            second.bind((host, port))
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, str(exc))
            log.warning(FALLBACK_MESSAGE, reason)
            return False
    return True
