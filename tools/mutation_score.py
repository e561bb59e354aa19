"""The mutation score per module, from ``mutmut results --all true`` on standard input.

``make mutants`` pipes mutmut's verdicts here. A mutant counts as caught when a test killed
it, when it ran out of time (the suite notices a hang), or when mypy, as strict as ``make lint``
runs it, rejected it (such a change can never be merged). ``by tests %`` is the share the tests
catch among the mutants mypy accepts; ``equiv %`` the share judged equivalent. The survivors
judged equivalent (no observable behaviour changes) are listed in
``tools/mutants-equivalent.txt``, one name a line with its reason after ``#``; they are shown
apart and never counted as caught.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

EQUIVALENT = Path(__file__).with_name("mutants-equivalent.txt")
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}
LINE = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+?)\s*$")
MODULE = re.compile(r"^(?P<module>.+?)\.x[_\u01c1]")


def equivalents() -> dict[str, str]:
    found: dict[str, str] = {}
    if not EQUIVALENT.exists():
        return found
    for raw in EQUIVALENT.read_text().splitlines():
        name, _, reason = raw.partition("#")
        if name.strip():
            found[name.strip()] = reason.strip()
    return found


def main() -> int:
    statuses: dict[str, dict[str, str]] = defaultdict(dict)
    for line in sys.stdin:
        match = LINE.match(line)
        if match is None:
            continue
        name, status = match["name"], match["status"]
        found = MODULE.match(name)
        statuses[found["module"] if found else "?"][name] = status
    judged = equivalents()
    if not statuses:
        print("no mutmut results on standard input", file=sys.stderr)
        return 1
    print(
        f"{'module':40} {'total':>6} {'killed':>6} {'mypy':>5} {'timeout':>7} "
        f"{'equiv':>5} {'survived':>8} {'no test':>7} {'caught %':>8} {'by tests %':>10} "
        f"{'equiv %':>7}"
    )
    unjudged: list[str] = []
    stale: list[str] = []
    for module in sorted(statuses):
        mutants = statuses[module]
        counts = Counter(mutants.values())
        equivalent = [n for n, s in mutants.items() if s == "survived" and n in judged]
        stale += [n for n in judged if n in mutants and mutants[n] != "survived"]
        unjudged += [n for n, s in mutants.items() if s == "survived" and n not in judged]
        caught = sum(counts[s] for s in CAUGHT)
        total = len(mutants) - counts["not checked"]
        if total == 0:
            print(f"{module:40} not run")
            continue
        # of the mutants mypy accepts, the share the tests catch (killed, or out of time)
        typed = max(total - counts["caught by type check"], 1)
        by_tests = counts["killed"] + counts["timeout"]
        print(
            f"{module:40} {total:6} {counts['killed']:6} {counts['caught by type check']:5} "
            f"{counts['timeout']:7} {len(equivalent):5} "
            f"{counts['survived'] - len(equivalent):8} {counts['no tests']:7} "
            f"{100 * caught / total:7.1f}% {100 * by_tests / typed:9.1f}% "
            f"{100 * len(equivalent) / total:6.1f}%"
        )
    if unjudged:
        print(f"\nsurvivors not judged equivalent ({len(unjudged)}): `mutmut show NAME` shows one")
        for name in sorted(unjudged):
            print(f"  {name}")
    if stale:
        print(f"\nlisted in {EQUIVALENT.name} but no longer surviving:")
        for name in sorted(stale):
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
