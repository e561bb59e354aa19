"""Performance figures for interlock-temporal, measured on this machine: ``python -m benchmarks``.

Performance targets live here, never in unit tests. Every figure is a distribution over many
samples (the machines are shared and noisy), and where a ratio is the point both sides are
measured interleaved in the same run. Files that need a real disk go under ``.bench/`` in the
project directory, never a tmpfs.
"""

from __future__ import annotations

from pathlib import Path

#: the project directory (the parent of this package)
ROOT = Path(__file__).resolve().parents[1]
#: where measurements keep their files: on the project's disk, ignored by git
BENCH_DIR = ROOT / ".bench"


def bench_dir(name: str) -> Path:
    """A fresh directory ``.bench/<name>`` (emptied if it exists), with ``.bench`` git-ignored."""
    import shutil

    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    ignore = BENCH_DIR / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# benchmark scratch files (python -m benchmarks)\n*\n")
    path = BENCH_DIR / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
