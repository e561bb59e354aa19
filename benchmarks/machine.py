"""What the figures were measured on: CPU, cores, the filesystem under the journal, versions."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Machine:
    cpu_model: str
    cores: int
    memory_gib: float | None
    kernel: str
    hostname: str
    python: str
    sqlite: str
    temporalio: str
    temporal_cli: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Filesystem:
    """The mount a path lives on."""

    path: str
    fstype: str
    device: str
    mount_point: str

    @property
    def is_tmpfs(self) -> bool:
        return self.fstype in ("tmpfs", "ramfs")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _temporal_cli() -> str:
    try:
        from interlock_temporal.testing import temporal_cli

        out = subprocess.run(
            [temporal_cli(), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip() or "unknown"
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return "not installed"


def code_version(root: Path) -> str:
    """The commit measured, and whether tracked files had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    if not changed:
        return f"commit {head}"
    files = ", ".join(sorted(line[3:] for line in changed))
    return f"commit {head} plus uncommitted changes to {len(changed)} tracked files ({files})"


def machine() -> Machine:
    return Machine(
        cpu_model=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        kernel=f"{platform.system()} {platform.release()}",
        hostname=platform.node(),
        python=platform.python_version(),
        sqlite=sqlite3.sqlite_version,
        temporalio=_version("temporalio"),
        temporal_cli=_temporal_cli(),
    )


def filesystem_of(path: Path) -> Filesystem:
    """The mount holding ``path`` (the longest mount point that prefixes it)."""
    target = path.resolve()
    best = Filesystem(str(target), "unknown", "unknown", "/")
    best_len = -1
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount_point, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        mp = Path(mount_point)
        if (target == mp or mp in target.parents) and len(mount_point) > best_len:
            best = Filesystem(str(target), fstype, device, mount_point)
            best_len = len(mount_point)
    return best
