"""The number of cases the running property test has executed (one pytest test at a time per process)."""

_count = 0


def reset() -> None:
    global _count  # noqa: PLW0603
    _count = 0


def tick() -> None:
    global _count  # noqa: PLW0603
    _count += 1


def value() -> int:
    return _count
