"""The git plumbing a ``GitRepo`` reads and moves its branch with: one ``git`` process per
question, never a worktree or the user's index; and where a changed fact came from (the commit,
the effect). ``GitRepo`` and its send (``Sender``) each hold the one ``Branch``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.models import Change
from ._edits import CommitResult, EditRequest
from ._errors import GitCommandFailed
from ._facts import ABSENT, TRAILER, file_value, parse_fact, symbol_value

#: what git must not inherit from the worker's environment: it would point git elsewhere
_GIT_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")
_LOG_FORMAT = f"%H%x1f%P%x1f%(trailers:key={TRAILER},valueonly,separator=%x2c)%x1e"


class Branch:
    """A branch of a local git repository, read and moved through git.

    ``author`` names the commits; ``on_point(point, effect_id)`` is called at the send's named
    points (``point``)."""

    def __init__(
        self,
        path: Path,
        branch: str,
        *,
        author: tuple[str, str],
        history_limit: int,
        timeout: float,
        git: str,
        on_point: Callable[[str, str], None] | None,
    ) -> None:
        self.path = path
        self.branch = branch
        self.ref = f"refs/heads/{branch}"
        self.history_limit = history_limit
        self.timeout = timeout
        self.git = git
        self.on_point = on_point
        env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROP}
        env.update(
            LC_ALL="C",
            GIT_TERMINAL_PROMPT="0",
            GIT_AUTHOR_NAME=author[0],
            GIT_AUTHOR_EMAIL=author[1],
            GIT_COMMITTER_NAME=author[0],
            GIT_COMMITTER_EMAIL=author[1],
        )
        self._env = env

    # -- git ---------------------------------------------------------------------------------

    def run(
        self,
        args: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        ok: Iterable[int] = (0,),
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            proc = subprocess.run(
                [self.git, "-C", str(self.path), *args],
                input=stdin,
                capture_output=True,
                env={**self._env, **env} if env else self._env,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as err:
            raise GitCommandFailed(args[0], f"{type(err).__name__}: {err}") from err
        if proc.returncode not in tuple(ok):
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise GitCommandFailed(
                args[0], detail[0] if detail else f"exit status {proc.returncode}"
            )
        return proc

    def out(self, args: Sequence[str], **kwargs: Any) -> str:
        """What ``git args`` printed, stripped."""
        return self.run(args, **kwargs).stdout.decode().strip()

    def update_ref(self, commit: str, expected: str, message: str) -> tuple[int, str]:
        """``git update-ref`` of the branch from ``expected`` to ``commit``: its exit status and
        what it said (status -1: git was killed on its timeout, and whether the ref moved is
        unknown). ``GitCommandFailed`` if git never started (the ref was not touched)."""
        args = ["update-ref", "-m", message, self.ref, commit, expected]
        try:
            proc = subprocess.run(
                [self.git, "-C", str(self.path), *args],
                capture_output=True,
                env=self._env,
                timeout=self.timeout,
                check=False,
            )
        except OSError as err:
            raise GitCommandFailed("update-ref", f"{type(err).__name__}: {err}") from err
        except subprocess.SubprocessError as err:  # killed on timeout: the caller reads it back
            return -1, f"{type(err).__name__}"
        return proc.returncode, proc.stderr.decode(errors="replace").strip()

    def rev(self, rev: str) -> str | None:
        """The commit ``rev`` names, None if it names none."""
        proc = self.run(["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], ok=(0, 1))
        if proc.returncode != 0:
            return None
        return proc.stdout.decode().strip() or None

    def head(self) -> str:
        """The commit the branch points at now."""
        head = self.rev(self.ref)
        if head is None:
            raise GitCommandFailed("rev-parse", f"branch {self.branch!r} is gone")
        return head

    def cat(self, specs: Sequence[str]) -> list[bytes | None]:
        """The blob each ``rev:path`` names (None: absent, or not a file), one git process."""
        if not specs:
            return []
        out = self.run(["cat-file", "--batch"], stdin="".join(s + "\n" for s in specs).encode())
        data, pos = out.stdout, 0
        found: list[bytes | None] = []
        for _ in specs:
            end = data.index(b"\n", pos)
            line = data[pos:end]
            pos = end + 1
            if line.endswith((b" missing", b" ambiguous")):  # "<spec> missing"
                found.append(None)
                continue
            _, kind, size = line.split()
            found.append(data[pos : pos + int(size)] if kind == b"blob" else None)
            pos += int(size) + 1
        return found

    def blobs(self, rev: str | None, paths: Iterable[str]) -> dict[str, bytes | None]:
        """The content of each path at ``rev`` (None: absent, or not a file)."""
        wanted = list(dict.fromkeys(paths))
        if rev is None:
            return dict.fromkeys(wanted)
        return dict(zip(wanted, self.cat([f"{rev}:{p}" for p in wanted]), strict=True))

    def facts_at(self, rev: str | None, keys: Sequence[str]) -> dict[str, Any]:
        """The value of each fact named in ``keys`` at ``rev`` (None: the branch has no commit)."""
        parsed = {k: parse_fact(k) for k in keys}
        blobs = self.blobs(rev, (p[0] for p in parsed.values() if p is not None))
        facts: dict[str, Any] = {}
        for key, where in parsed.items():
            if where is None:
                facts[key] = None  # a fact this target cannot tell: never equal to a recorded one
                continue
            path, qual = where
            facts[key] = (
                file_value(blobs[path]) if qual is None else symbol_value(blobs[path], qual)
            )
        return facts

    def _log(self, args: Sequence[str]) -> list[tuple[str, list[str], list[str]]]:
        """(commit, parents, effect ids in its trailers), newest first."""
        out = self.run(["log", f"--format={_LOG_FORMAT}", *args]).stdout.decode()
        records = []
        for raw in out.split("\x1e"):
            raw = raw.strip("\n")
            if not raw:
                continue
            sha, parents, effects = [*raw.split("\x1f"), "", ""][:3]
            records.append(
                (
                    sha,
                    parents.split(),
                    [e.strip() for e in effects.replace("\n", ",").split(",") if e.strip()],
                )
            )
        return records

    def own(self, effect_id: str, revs: str) -> list[tuple[str, list[str]]]:
        """The commits in ``revs`` that carry this effect's trailer, oldest first."""
        hits = self._log(["-F", f"--grep={TRAILER}: {effect_id}", revs])
        return [(sha, parents) for sha, parents, effects in reversed(hits) if effect_id in effects]

    def landed(self, effect_id: str) -> list[str]:
        """Every commit on the branch carrying this effect's trailer (exactly one, if landed)."""
        return [sha for sha, _ in self.own(effect_id, self.ref)]

    def result_of(self, commit: str, parents: list[str], effect_id: str) -> CommitResult:
        """What the commit ``commit`` (with ``parents``) of this effect changed, as a result."""
        out = self.run(["diff-tree", "--no-commit-id", "-r", "--name-only", "-z", "--root", commit])
        paths = sorted(p for p in out.stdout.decode().split("\0") if p)
        return CommitResult(
            commit=commit,
            branch=self.branch,
            parent=parents[0] if parents else None,
            paths=paths,
            effect_id=effect_id,
        )

    def point(self, name: str, effect_id: str) -> None:
        if self.on_point is not None:
            self.on_point(name, effect_id)

    def provenance(self, changes: Sequence[Change], head: str) -> list[Change]:
        """Each changed fact with the commit (and effect) that made it what it is at ``head``."""
        out = []
        for change in changes:
            where = parse_fact(change.fact)
            rule = "does not exist yet" if change.recorded == ABSENT else "unchanged"
            if where is None or not isinstance(change.current, str):
                out.append(change.model_copy(update={"rule": rule}))
                continue
            commit, effect = self._introduced(change.fact, change.current, head)
            out.append(
                change.model_copy(
                    update={
                        "rule": rule,
                        "current": {"value": change.current, "commit": commit, "effect": effect},
                    }
                )
            )
        return out

    def _introduced(self, fact: str, value: str, head: str) -> tuple[str | None, str | None]:
        """The commit (and its effect) that gave ``fact`` its current ``value``: the oldest of
        the newest run of commits touching the path at which the fact has that value."""
        where = parse_fact(fact)
        assert where is not None
        path, qual = where
        history = self._log([f"-n{self.history_limit}", head, "--", path])
        contents = self.cat([f"{sha}:{path}" for sha, _, _ in history])
        found: tuple[str | None, str | None] = (None, None)
        for (sha, _, effects), content in zip(history, contents, strict=True):
            now = file_value(content) if qual is None else symbol_value(content, qual)
            if now != value:
                break
            found = (sha, effects[0] if effects else None)
        return found


def fact_keys(edit: EditRequest) -> list[str]:
    """The facts an edit relies on: those it names, and those its premises carry."""
    return list(dict.fromkeys([*edit.fact_keys(), *(edit.premises or {})]))
