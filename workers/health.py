"""The worker container's health check: ``python -m workers.health [--max-age-s S] [FILE]``.

A worker started with ``--health-file FILE`` (or ``$INTERLOCK_HEALTH_FILE``) writes the time into
it every few seconds once it polls. Exit 0 while that time is at most ``--max-age-s`` old;
exit 1, saying why, when the file is missing, unreadable or stale (a worker that never
connected, or whose event loop is stuck).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

HEALTH_FILE_ENV = "INTERLOCK_HEALTH_FILE"
#: how often a running worker refreshes its heartbeat
BEAT_S = 5.0


def beat(path: Path) -> None:
    """Write the time into ``path`` (replaced whole: a reader never sees half of it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(f"{time.time():.3f}\n")
    partial.replace(path)


async def heartbeat(path: Path, every_s: float = BEAT_S) -> None:
    """Beat every ``every_s`` until cancelled."""
    while True:
        beat(path)
        await asyncio.sleep(every_s)


def check(path: Path, max_age_s: float, now: float | None = None) -> str | None:
    """None if the heartbeat is fresh, else why the worker is not healthy."""
    try:
        written = float(path.read_text().strip())
    except FileNotFoundError:
        return f"no heartbeat at {path}: the worker has not started polling"
    except (OSError, ValueError) as err:
        return f"heartbeat {path} unreadable: {err}"
    age = (time.time() if now is None else now) - written
    if age > max_age_s:
        return f"heartbeat {path} is {age:.0f} s old (more than {max_age_s:g} s)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("file", nargs="?", type=Path, default=os.environ.get(HEALTH_FILE_ENV))
    p.add_argument("--max-age-s", type=float, default=30.0)
    args = p.parse_args(argv)
    if args.file is None:
        print(f"no heartbeat file: pass one or set {HEALTH_FILE_ENV}", file=sys.stderr)
        return 1
    problem = check(Path(args.file), args.max_age_s)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
