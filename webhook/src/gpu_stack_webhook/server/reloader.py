"""Runtime reload of the policy file, keeping the last good policy when a new one is broken.

Kubernetes updates a mounted ConfigMap by writing a new timestamped directory and swapping the
`..data` symlink atomically, so the file path stays the same while the file it resolves to changes
(another inode, another mtime). Each worker checks `os.stat(path)` (which follows the symlinks) at
most once every `interval` seconds, on the request path, from whichever thread comes first (the
others go on with the current policy, they never wait). When the signature changed:

* the new file parses (ConfigError otherwise): a new `Policy` is swapped in (one attribute store, so
  a request in flight finishes with the policy it started with), logged as `policy reloaded`;
* it does not: the last good policy stays and one JSON line at ERROR says why, the ConfigError text
  naming the bad key (`... invalid policy config: sharing.configs.default.flags.migStrategy: ...`).
  It is logged once per broken version, not on every check.

`maxRequestBytes` is read at start only (it sizes the HTTP layer): a change needs a restart. Only a
ConfigMap mounted as a directory is ever updated in a running pod, which is why the chart mounts the
policy ConfigMap at /etc/gpu-stack/policy/ without subPath. (A Helm upgrade also rolls the pods through
the checksum annotation; the reload is what makes `kubectl edit configmap` take effect.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_stack_webhook.filewatch import file_signature
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, load_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.settings import DEFAULT_RELOAD_SECONDS

log = logging.getLogger("gpu_stack_webhook.server.reloader")

class ReloadingPolicy:
    """A policy source (call it for the policy of a request) that re-reads the policy file when it changes."""

    def __init__(
        self,
        path: str,
        config: PolicyConfig,
        *,
        interval: float = DEFAULT_RELOAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        built: Policy | None = None,
        **policy_kwargs: Any,
    ) -> None:
        """`policy_kwargs` (rules, facts, ...) are passed to every Policy built; `built`: the Policy of
        `config` and them, when the caller has it already."""
        self.path = path
        self.interval = interval
        self._clock = clock
        self._policy_kwargs = policy_kwargs
        self._current = built if built is not None else Policy(config, **policy_kwargs)
        self._signature = file_signature(path)
        self._next_check = clock() + interval
        self._lock = threading.Lock()

    @property
    def current(self) -> Policy:
        return self._current

    def maybe_reload(self) -> Policy:
        """The policy to use for this request, after a reload check when one is due."""
        if self._clock() >= self._next_check and self._lock.acquire(blocking=False):
            try:
                self._next_check = self._clock() + self.interval
                self._check()
            finally:
                self._lock.release()
        return self._current

    def _check(self) -> None:
        signature = file_signature(self.path)
        if signature is None or signature == self._signature:
            return  # unchanged, or mid-swap / missing: keep what we have and look again later
        self._signature = signature
        try:
            config = load_config(self.path)
            policy = Policy(config, **self._policy_kwargs)
        except ConfigError as exc:
            log.error(
                "policy reload failed; keeping the last good policy",
                extra={"policy": self.path, "error": str(exc), "event": "policy-reload-failed"},
            )
            return
        except Exception as bug:  # a bug must not take the serving policy down with it
            log.exception("policy reload failed; keeping the last good policy",
                          extra={"policy": self.path, "error": f"{type(bug).__name__}: {bug}",
                                 "event": "policy-reload-failed"})
            return
        self._current = policy
        log.info("policy reloaded", extra={"policy": self.path, "event": "policy-reloaded"})

    def __call__(self) -> Policy:
        """The policy to judge one request with (reloaded first when the file changed)."""
        return self.maybe_reload()


PolicySource = Callable[[], Policy]


def serving_policy(config: PolicyConfig, path: str | None, interval: float, built: Policy | None = None,
                   **policy_kwargs: Any) -> PolicySource:
    """What create_app serves from: called once per request for the policy to judge it with. A
    reloading source when the policy was read from a file and `interval` (WebhookSettings.reload_seconds,
    $GPU_STACK_WEBHOOK_RELOAD_SECONDS) is above 0, else a fixed one. `built`: the Policy of `config` and
    `policy_kwargs`, when the caller has it already."""
    if not path or interval <= 0:
        policy = built if built is not None else Policy(config, **policy_kwargs)
        return lambda: policy
    return ReloadingPolicy(path, config, interval=interval, built=built, **policy_kwargs)
