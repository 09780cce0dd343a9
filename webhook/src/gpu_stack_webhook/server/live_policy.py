"""The serving policy when it follows the cluster (`serve --policy-source gpu-operator|device-plugin`).

A daemon thread in each gunicorn worker (started by the first request the worker serves, so it exists
after the fork) reads the live configuration every `interval` seconds through a kube/live.py reader,
together with the policy file (re-read when it changed, as server/reloader.py does), and swaps in a new
`Policy` when the result differs: one attribute store, a request in flight finishes with the policy it
started with. A change of the ClusterPolicy or the device plugin ConfigMap is followed within
`interval` seconds, without a restart. When the live configuration cannot be read (past the reader's kept
last good read, kube/live.py LastGood) the policy denies GPU pods (GPU010) with the reader's message, logged
once per change at ERROR. After each read the thread publishes when each source was last read in full
(server/metrics.py gpu_stack_policy_source_last_read_timestamp_seconds).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_stack_webhook.filewatch import file_signature
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, load_config
from gpu_stack_webhook.policy.engine import Policy

log = logging.getLogger("gpu_stack_webhook.server.live_policy")
DEFAULT_INTERVAL = 2.0


class LivePolicy:
    """A policy source (call it for the policy of a request) that follows the live configuration."""

    def __init__(self, path: str | None, config: PolicyConfig, read: Callable[[PolicyConfig], PolicyConfig],
                 *, interval: float = DEFAULT_INTERVAL, describe: str = "the live configuration",
                 built: Policy | None = None, publish: Callable[[dict[str, float]], None] | None = None,
                 **policy_kwargs: Any) -> None:
        """`built`: the Policy of `config` and `policy_kwargs` when the caller has it already, served as it
        is while the live configuration adds nothing to `config`. `publish`: given, after each read in the
        following thread, when each source was last read in full (the reader's `last_reads`)."""
        self.path = path
        self.publish = publish
        self.read = read
        self.interval = interval
        self.describe = describe
        self._policy_kwargs = policy_kwargs
        self._base = config
        self._signature = file_signature(path) if path else None
        self._config = read(config)
        self._current = built if built is not None and self._config == config else Policy(self._config,
                                                                                          **policy_kwargs)
        self._announce(None)
        self._pid = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> Policy:
        return self._current

    def _base_now(self) -> PolicyConfig:
        if not self.path:
            return self._base
        signature = file_signature(self.path)
        if signature is not None and signature != self._signature:
            self._signature = signature
            try:
                self._base = load_config(self.path)
            except ConfigError as exc:
                log.error("policy reload failed; keeping the last good policy",
                          extra={"policy": self.path, "error": str(exc), "event": "policy-reload-failed"})
        return self._base

    def refresh(self) -> bool:
        """Read once; True when the policy changed."""
        config = self.read(self._base_now())
        if config == self._config:
            return False
        try:
            policy = Policy(config, **self._policy_kwargs)
        except ConfigError as exc:
            log.error("policy not updated", extra={"error": str(exc), "event": "policy-reload-failed"})
            return False
        before, self._config, self._current = self._config, config, policy
        self._announce(before)
        return True

    def _announce(self, before: PolicyConfig | None) -> None:
        config = self._config
        if config.source_error:
            if before is None or before.source_error != config.source_error:
                log.error("GPU pods are denied: %s cannot be read", self.describe,
                          extra={"error": config.source_error, "event": "policy-source-unavailable"})
            return
        configs = {name: cfg.model_dump(by_alias=True, mode="json", exclude_defaults=True)
                   for name, cfg in config.sharing.configs.items()}
        log.info("policy follows %s", self.describe,
                 extra={"event": "policy-source-read", "defaultConfig": config.sharing.default_config,
                        "configs": configs, "nvidiaRuntimeIsDefault": config.nvidia_runtime_is_default,
                        "nvidiaRuntimeHandlers": list(config.nvidia_runtime_handlers),
                        "nriPluginEnabled": config.nri_plugin_enabled})

    def _publish(self) -> None:
        last_reads = getattr(self.read, "last_reads", None)
        if self.publish is not None and last_reads is not None:
            self.publish(last_reads())

    def _follow(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.refresh()
                self._publish()
            except Exception as bug:  # a bug must not stop the following; the last policy stays
                log.exception("policy source read failed", extra={"error": f"{type(bug).__name__}: {bug}"})

    def __call__(self) -> Policy:
        if self._pid != os.getpid():  # first request of this process (after gunicorn's fork)
            with self._lock:
                if self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._publish()  # in this worker, never in gunicorn's master (Metrics.source_read)
                    threading.Thread(target=self._follow, name="policy-source", daemon=True).start()
        return self._current
