"""`python -m gpu_stack_dev.generate [--check | --list]` (`make generate`): rewrite every generated file."""

from __future__ import annotations

import argparse
import sys

from gpu_stack_dev.generate import generated, leftovers, stale_message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_stack_dev.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every stale file")
    parser.add_argument("--list", action="store_true", help="list every generated file and its source")
    args = parser.parse_args(argv)
    if args.list:
        for item in generated():
            print(f"{item.name}: from {item.source}")
        return 0
    if args.check:
        stale = [item.name for item in generated() if item.stale()]
        stale += [path.as_posix() for path in leftovers()]
        for name in stale:
            print(stale_message(name), file=sys.stderr)
        return 1 if stale else 0
    for path in leftovers():
        path.unlink()
    for item in generated():
        wanted = item.wanted()
        if wanted != item.current():
            item.path.parent.mkdir(parents=True, exist_ok=True)
            item.path.write_text(wanted, encoding="utf-8")
            print(f"wrote {item.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
