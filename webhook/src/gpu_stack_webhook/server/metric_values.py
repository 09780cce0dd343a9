"""Buffered multiprocess metric values: an increment on the review path is an add in memory.

prometheus_client's multiprocess value (`values.MultiProcessValue()`) writes every `inc` to this
process's mmap file, after an `os.getpid()` under a process-wide lock to notice a fork: a syscall and a
file write per counter increment, four of them per review (reviews counter, duration sum and bucket,
one per finding). `BufferedValue` wraps one of those values: `inc` only adds to a pending amount under
its own lock; `flush` moves the pending amount into the wrapped value (whose pid check then writes this
process's file). `get` is the wrapped value plus the pending amount; `set` (gauges, Counter.reset) drops
what is pending and writes through at once, so a set is never overtaken by older increments.

Who flushes:

* one daemon thread per process, every `FLUSH_INTERVAL_SECONDS`, started by the first `inc` in that
  process; every value registers itself here when it is made (label sets are bounded, so is the list);
* `/metrics` (`Metrics.render`) flushes the serving process before it reads the files;
* a gunicorn worker flushes on its way out (the `worker_exit` hook in gunicorn_conf.settings).

The trade-off: a scrape sees the serving worker's counts exactly and may miss up to about one second of
the other workers' latest counts (they appear on the next scrape; counters never go backwards); a worker
killed by SIGKILL loses at most its last second of counts. Nothing else changes for Prometheus.

Forks: gunicorn builds the app in the master and forks the workers. In a child, every value forgets
what was pending in the parent (the parent still counts and flushes it itself), gets fresh locks (a
parent thread may have held one at the fork), and the flusher thread, which a fork does not copy, is
started again by the child's first `inc`. A fork waits for a flush in progress, so the child never
inherits prometheus_client's lock held by a half-done write.

Outside multiprocess mode (tests, `check`) prometheus_client's in-memory MutexValue stays in use.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import values as prometheus_values

FLUSH_INTERVAL_SECONDS = 1.0


class _Process:
    """This process's values and its flusher thread."""

    __slots__ = ("flush_lock", "flusher", "start_lock", "values")

    def __init__(self) -> None:
        # Every BufferedValue made in this process (list.append and list() copies are atomic under the GIL).
        self.values: list[BufferedValue] = []
        self.forget_the_parent()

    def forget_the_parent(self) -> None:
        """At start, and in a forked child: the parent's locks may have been held, its flusher thread
        is not in the child, and the parent flushes what it had pending itself."""
        # Held during a flush pass, and across os.fork() so a child never starts inside one.
        self.flush_lock = threading.Lock()
        self.start_lock = threading.Lock()
        self.flusher: threading.Thread | None = None
        for value in list(self.values):
            value.forget_the_parent()


_process = _Process()


class BufferedValue:
    """A multiprocess value whose increments reach the file at the next flush (module docstring).
    Compiled (webhook/setup.py): `inc` runs several times per review."""

    __slots__ = ("_lock", "_pending", "_wrapped")

    def __init__(self, wrapped: Any) -> None:
        """`wrapped`: the prometheus_client MmapedValue this value writes through (buffered_value_class)."""
        self._wrapped = wrapped
        self._pending = 0.0
        self._lock = threading.Lock()
        _process.values.append(self)

    def inc(self, amount: float) -> None:
        with self._lock:
            self._pending += amount
        if _process.flusher is None:
            _start_flusher()

    def flush(self) -> None:
        if not self._pending:  # read without the lock: an increment racing it waits for the next flush
            return
        with self._lock:
            amount, self._pending = self._pending, 0.0
            if amount:
                self._wrapped.inc(amount)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with self._lock:
            self._pending = 0.0
            self._wrapped.set(value, timestamp)

    def get(self) -> float:
        with self._lock:
            return float(self._wrapped.get()) + self._pending

    def forget_the_parent(self) -> None:
        """In a forked child (_Process.forget_the_parent)."""
        self._lock = threading.Lock()
        self._pending = 0.0

    def set_exemplar(self, exemplar: Any) -> None:
        self._wrapped.set_exemplar(exemplar)

    def get_exemplar(self) -> Any:
        return self._wrapped.get_exemplar()


def buffered_value_class() -> Callable[..., BufferedValue]:
    """A value class for `prometheus_client.values.ValueClass` (which prometheus_client only calls, with
    typ, metric_name, name, labelnames, labelvalues, help_text and for gauges multiprocess_mode): buffered
    values writing to $PROMETHEUS_MULTIPROC_DIR through a fresh `MultiProcessValue()` (its own files, as
    prometheus_client's `get_value_class`)."""
    wrapped_class = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call,unused-ignore]

    def buffered_value(*params: Any, **kwargs: Any) -> BufferedValue:
        return BufferedValue(wrapped_class(*params, **kwargs))

    return buffered_value


def flush_all() -> None:
    """Move every pending amount of this process into its file."""
    with _process.flush_lock:
        for value in list(_process.values):
            value.flush()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_SECONDS)
        flush_all()


def _start_flusher() -> None:
    with _process.start_lock:
        if _process.flusher is None:
            thread = threading.Thread(target=_flush_forever, name="metrics-flusher", daemon=True)
            thread.start()
            _process.flusher = thread


def _before_fork() -> None:
    _process.flush_lock.acquire()


def _after_fork_in_parent() -> None:
    _process.flush_lock.release()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_process.forget_the_parent
)
