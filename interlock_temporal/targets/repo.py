"""A local git repository as a target: each effect is one commit on a branch (tier 2).

Several agents edit one repository in parallel. Each edit (write a file, apply a patch, define or
replace a Python symbol) is an effect behind the gate, and carries the facts its agent relied on
when it decided (its premises):

- ``file:<path>``: the sha256 of the file's bytes on the branch, or ``absent``;
- ``symbol:<path>::<qualname>``: the sha256 of the symbol's normalised source (``ast.unparse``
  of its node: formatting, comments and line positions do not count), or ``absent`` (a new
  definition relies on "this symbol does not exist yet").

The send (``GitRepo.apply``) never touches a worktree or the user's index. It builds the new tree
on a temporary index from the branch head, writes a commit whose message carries the trailer
``Interlock-Effect: <effect id>``, and moves the branch with a compare-and-swap
(``git update-ref refs/heads/<branch> <new> <expected old>``). The premises are checked again
against the very head the commit is built on, so an edit that lands relied on facts that were
true of its parent. If another agent moved the branch first, the swap fails; the send re-checks
the premises against the new head and either rebuilds the edit on it (the premises still hold:
another file, another symbol) or refuses (``PremiseChanged``, naming the fact, the commit and the
effect that changed it).

Tier 2: ``query(effect_id)`` finds the commit carrying the trailer on the branch. There is no
dedupe window, and a local repository settles at once.

Point the target at a branch nobody has checked out (or at a bare repository): the branch moves
under a worktree that has it checked out, and that worktree's ``git commit -a`` would undo the
agents' edits.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ..core.models import Change, Found
from ..core.targets import BaseTarget, Classification, default_validate

__all__ = [
    "ABSENT",
    "TRAILER",
    "AnyEdit",
    "ApplyPatch",
    "CommitResult",
    "DefineSymbol",
    "EditDoesNotApply",
    "EditRejected",
    "EditRequest",
    "GitCommandFailed",
    "GitRepo",
    "LandingInDoubt",
    "NotLanded",
    "PremiseChanged",
    "ReplaceSymbol",
    "RepoError",
    "WriteFile",
    "file_fact",
    "parse_edit",
    "symbol_fact",
    "symbol_value",
]

#: the commit trailer that names the effect a commit is
TRAILER = "Interlock-Effect"
#: the value of a fact about a file or symbol that does not exist
ABSENT = "absent"
_SHA = "sha256:"
#: one parse at a time: CPython 3.11 (3.11.7 here) keeps the AST converter's recursion depth in
#: state shared by all threads, and two threads parsing at once can fail with "AST constructor
#: recursion depth mismatch" (CPython gh-106905); a worker runs activities on several threads
_PARSE_LOCK = threading.Lock()
_UNPARSEABLE = "unparseable:"


# -- facts ----------------------------------------------------------------------------------------


def file_fact(path: str) -> str:
    """The name of the fact "the content of ``path``"."""
    return f"file:{_norm_path(path)}"


def symbol_fact(path: str, qualname: str) -> str:
    """The name of the fact "the source of ``qualname`` in ``path``" (``Class.method`` nests)."""
    return f"symbol:{_norm_path(path)}::{_check_qualname(qualname)}"


def _parse_fact(name: str) -> tuple[str, str | None] | None:
    """(path, qualname or None for a whole file), or None for a name this target does not know."""
    try:
        if name.startswith("file:"):
            return _norm_path(name[5:]), None
        if name.startswith("symbol:"):
            path, sep, qual = name[7:].rpartition("::")
            if not sep:
                return None
            return _norm_path(path), _check_qualname(qual)
    except ValueError:
        return None
    return None


def _digest(data: bytes) -> str:
    return _SHA + hashlib.sha256(data).hexdigest()


def file_value(content: bytes | None) -> str:
    return ABSENT if content is None else _digest(content)


def symbol_value(content: bytes | None, qualname: str) -> str:
    """The fact value of ``qualname`` in a file's ``content``: the digest of ``ast.unparse`` of
    its node (decorators included, comments, formatting and positions not), ``absent`` when the
    file or the symbol does not exist, ``unparseable:<file digest>`` when the file is not Python
    this interpreter can parse (so any change of it is still seen)."""
    if content is None:
        return ABSENT
    try:
        with _PARSE_LOCK:
            module = ast.parse(content)
    except (SyntaxError, ValueError):
        return _UNPARSEABLE + _digest(content)
    node = _locate(module, qualname)
    return ABSENT if node is None else _digest(ast.unparse(node).encode())


def _defined_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.name
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _locate(module: ast.Module, qualname: str) -> ast.stmt | None:
    """The statement that defines ``qualname`` (the last one, as Python binds it)."""
    body: list[ast.stmt] = module.body
    parts = qualname.split(".")
    node: ast.stmt | None = None
    for i, part in enumerate(parts):
        found = None
        for stmt in body:
            if _defined_name(stmt) == part:
                found = stmt
        if found is None:
            return None
        if i < len(parts) - 1:
            if not isinstance(found, ast.ClassDef):
                return None
            body = found.body
        node = found
    return node


# -- edit requests --------------------------------------------------------------------------------


def _norm_path(value: str) -> str:
    if not value or "\n" in value or "\0" in value or "\\" in value:
        raise ValueError("a repository path is a non-empty relative POSIX path")
    p = PurePosixPath(value)
    if p.is_absolute() or any(part in ("..", ".") for part in value.split("/")):
        raise ValueError("a repository path must be relative, without '.' or '..'")
    if p.parts[0] == ".git":
        raise ValueError("a repository path must not be inside .git")
    return str(p)


def _check_qualname(value: str) -> str:
    if not value or not all(part.isidentifier() for part in value.split(".")):
        raise ValueError("a symbol is a dotted Python name, e.g. 'helper' or 'Parser.parse'")
    return value


def _single_definition(source: str, name: str) -> None:
    try:
        module = ast.parse(textwrap.dedent(source))
    except SyntaxError as err:
        raise ValueError(f"the source of {name!r} does not parse: {err.msg}") from None
    if len(module.body) != 1 or _defined_name(module.body[0]) != name:
        raise ValueError(f"the source must be exactly one definition of {name!r}")


class EditRequest(BaseModel):
    """What every edit carries: the facts it relies on beyond its own, and the premises.

    - ``reads``: files the agent relied on whole (their content hash is a premise);
    - ``relies_on``: symbols it relied on, ``"path::qualname"`` (finer: a change elsewhere in
      the file is not a change of the premise);
    - ``premises``: the facts as the agent saw them when it decided (``GitRepo.facts_for``);
      the gate re-validates them before the first send and every resend, the send once more
      against the head it commits on. Not part of the payload digest (``premises_field``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reads: list[str] = Field(default_factory=list)
    relies_on: list[str] = Field(default_factory=list)
    message: str | None = None
    premises: dict[str, Any] | None = None

    @field_validator("reads")
    @classmethod
    def _check_reads(cls, value: list[str]) -> list[str]:
        return [_norm_path(p) for p in value]

    @field_validator("relies_on")
    @classmethod
    def _check_relies_on(cls, value: list[str]) -> list[str]:
        out = []
        for ref in value:
            path, sep, qual = ref.rpartition("::")
            if not sep:
                raise ValueError("relies_on entries look like 'path::qualname'")
            out.append(f"{_norm_path(path)}::{_check_qualname(qual)}")
        return out

    @field_validator("message")
    @classmethod
    def _check_message(cls, value: str | None) -> str | None:
        if value is not None and TRAILER.lower() in value.lower():
            raise ValueError(f"a commit message must not carry the {TRAILER} trailer itself")
        return value

    def own_facts(self) -> list[str]:
        """The facts the edit itself relies on (a replaced symbol's source, a new one's absence)."""
        return []

    def fact_keys(self) -> list[str]:
        """Every fact this edit relies on, in a stable order."""
        keys = [
            *self.own_facts(),
            *(f"file:{p}" for p in self.reads),
            *(f"symbol:{ref}" for ref in self.relies_on),
        ]
        return list(dict.fromkeys(keys))

    def subject(self) -> str:
        return "edit"


class WriteFile(EditRequest):
    """Write ``content`` to ``path`` (created if absent). Relies on the file as it was read."""

    kind: Literal["write_file"] = "write_file"
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _norm_path(value)

    def own_facts(self) -> list[str]:
        return [f"file:{self.path}"]

    def subject(self) -> str:
        return f"write {self.path}"


class ApplyPatch(EditRequest):
    """Apply a unified diff (``git apply`` semantics: the patch's context must still match)."""

    kind: Literal["apply_patch"] = "apply_patch"
    patch: str

    def subject(self) -> str:
        return "apply a patch"


class DefineSymbol(EditRequest):
    """Append a new top-level definition of ``symbol`` to ``path`` (created if absent). Relies on
    "``symbol`` does not exist yet"."""

    kind: Literal["define_symbol"] = "define_symbol"
    path: str
    symbol: str
    source: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _norm_path(value)

    @field_validator("symbol")
    @classmethod
    def _check_symbol(cls, value: str) -> str:
        if "." in _check_qualname(value):
            raise ValueError("DefineSymbol defines a top-level name (no dots)")
        return value

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str, info: ValidationInfo) -> str:
        name = info.data.get("symbol")
        if isinstance(name, str):
            _single_definition(value, name)
        return value

    def own_facts(self) -> list[str]:
        return [f"symbol:{self.path}::{self.symbol}"]

    def subject(self) -> str:
        return f"define {self.symbol} in {self.path}"


class ReplaceSymbol(EditRequest):
    """Replace the definition of ``symbol`` (``name`` or ``Class.method``) in ``path`` with
    ``source``. Relies on the symbol's source as the agent read it."""

    kind: Literal["replace_symbol"] = "replace_symbol"
    path: str
    symbol: str
    source: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _norm_path(value)

    @field_validator("symbol")
    @classmethod
    def _check_symbol(cls, value: str) -> str:
        return _check_qualname(value)

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str, info: ValidationInfo) -> str:
        name = info.data.get("symbol")
        if isinstance(name, str):
            _single_definition(value, name.rsplit(".", 1)[-1])
        return value

    def own_facts(self) -> list[str]:
        return [f"symbol:{self.path}::{self.symbol}"]

    def subject(self) -> str:
        return f"replace {self.symbol} in {self.path}"


AnyEdit = Annotated[
    WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol, Field(discriminator="kind")
]
_EDIT: TypeAdapter[WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol] = TypeAdapter(AnyEdit)
E = TypeVar("E", bound=EditRequest)


class CommitResult(BaseModel):
    """What landed: the commit, the branch it is on, its parent, the paths it changed."""

    model_config = ConfigDict(frozen=True)

    commit: str
    branch: str
    parent: str | None
    paths: list[str]
    effect_id: str
    #: how many times the send built the edit (more than 1: it was rebased onto a moved branch);
    #: None when the commit was found rather than made by this call
    attempts: int | None = None


# -- errors, by what they mean for a resend ------------------------------------------------------


class RepoError(Exception):
    """Base of what ``GitRepo.apply`` raises; ``classify`` maps each subclass."""


class EditRejected(RepoError):
    """Nothing landed and resending the same edit cannot help: a confirmed rejection."""


class PremiseChanged(EditRejected):
    """A fact the edit relied on no longer holds at the branch head the send would commit on.
    ``changes[i].current`` is ``{"value", "commit", "effect"}``: the value now and the commit
    (and effect, if a gated edit) that made it so."""

    def __init__(self, changes: Sequence[Change], head: str) -> None:
        self.changes = list(changes)
        self.head = head
        parts = []
        for c in self.changes:
            cur = c.current if isinstance(c.current, dict) else {}
            by = cur.get("commit")
            eff = cur.get("effect")
            who = f" (changed by commit {by[:12]}" if by else ""
            who += f", effect {eff[:16]})" if by and eff else (")" if by else "")
            parts.append(f"{c.fact}{who}")
        super().__init__(f"at {head[:12]} the facts the edit relied on changed: {'; '.join(parts)}")


class EditDoesNotApply(EditRejected):
    """The edit cannot be made on the branch as it is (the symbol to replace is gone, a new
    symbol exists already, the patch does not apply, the file does not parse)."""


class NotLanded(RepoError):
    """Nothing landed (git failed before the ref update, or the ref was read back unchanged);
    a later attempt may send it again."""


class GitCommandFailed(NotLanded):
    """A git command failed or could not start."""

    def __init__(self, command: str, detail: str) -> None:
        super().__init__(f"git {command} failed: {detail}")
        self.command = command
        self.detail = detail


class LandingInDoubt(RepoError):
    """The ref update was attempted and its outcome could not be read back."""


# -- the target ------------------------------------------------------------------------------------

_GIT_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")
_LOG_FORMAT = f"%H%x1f%P%x1f%(trailers:key={TRAILER},valueonly,separator=%x2c)%x1e"


class GitRepo(BaseTarget):
    """A branch of a local git repository, as an effect target (tier 2) and as the send.

    ``on_point(point, effect_id)`` is called at ``"before_ref_update"`` and
    ``"after_ref_update"`` (tests raise ``SimulatedCrash`` there, as a dying worker would).
    """

    tier = 2
    dedupe_window: timedelta | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        branch: str = "main",
        *,
        name: str = "git",
        author: tuple[str, str] = ("interlock", "interlock@localhost"),
        settle_time: timedelta = timedelta(0),
        max_attempts: int = 32,
        history_limit: int = 200,
        timeout: float = 60.0,
        git: str = "git",
        on_point: Callable[[str, str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.branch = branch
        self.ref = f"refs/heads/{branch}"
        self.name = name
        self.settle_time = settle_time
        self.max_attempts = max_attempts
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
        self._run(["check-ref-format", self.ref])
        if self._rev(self.ref) is None:
            raise ValueError(f"{self.path}: branch {branch!r} does not exist (make a first commit)")

    def __repr__(self) -> str:
        return f"GitRepo({str(self.path)!r}, branch={self.branch!r})"

    # -- git ---------------------------------------------------------------------------------

    def _run(
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

    def _out(self, args: Sequence[str], **kwargs: Any) -> str:
        return self._run(args, **kwargs).stdout.decode().strip()

    def _rev(self, rev: str) -> str | None:
        proc = self._run(["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], ok=(0, 1))
        if proc.returncode != 0:
            return None
        return proc.stdout.decode().strip() or None

    def head(self) -> str:
        """The commit the branch points at now."""
        head = self._rev(self.ref)
        if head is None:
            raise GitCommandFailed("rev-parse", f"branch {self.branch!r} is gone")
        return head

    def _cat(self, specs: Sequence[str]) -> list[bytes | None]:
        """The blob each ``rev:path`` names (None: absent, or not a file), one git process."""
        if not specs:
            return []
        out = self._run(["cat-file", "--batch"], stdin="".join(s + "\n" for s in specs).encode())
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

    def _blobs(self, rev: str | None, paths: Iterable[str]) -> dict[str, bytes | None]:
        """The content of each path at ``rev`` (None: absent, or not a file)."""
        wanted = list(dict.fromkeys(paths))
        if rev is None:
            return dict.fromkeys(wanted)
        return dict(zip(wanted, self._cat([f"{rev}:{p}" for p in wanted]), strict=True))

    def _facts_at(self, rev: str | None, keys: Sequence[str]) -> dict[str, Any]:
        parsed = {k: _parse_fact(k) for k in keys}
        blobs = self._blobs(rev, (p[0] for p in parsed.values() if p is not None))
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
        out = self._run(["log", f"--format={_LOG_FORMAT}", *args]).stdout.decode()
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

    def _own(self, effect_id: str, revs: str) -> list[tuple[str, list[str]]]:
        """The commits in ``revs`` that carry this effect's trailer, oldest first."""
        hits = self._log(["-F", f"--grep={TRAILER}: {effect_id}", revs])
        return [(sha, parents) for sha, parents, effects in reversed(hits) if effect_id in effects]

    def landed(self, effect_id: str) -> list[str]:
        """Every commit on the branch carrying this effect's trailer (exactly one, if landed)."""
        return [sha for sha, _ in self._own(effect_id, self.ref)]

    def _result_of(self, commit: str, parents: list[str], effect_id: str) -> CommitResult:
        out = self._run(
            ["diff-tree", "--no-commit-id", "-r", "--name-only", "-z", "--root", commit]
        )
        paths = sorted(p for p in out.stdout.decode().split("\0") if p)
        return CommitResult(
            commit=commit,
            branch=self.branch,
            parent=parents[0] if parents else None,
            paths=paths,
            effect_id=effect_id,
        )

    def _point(self, name: str, effect_id: str) -> None:
        if self.on_point is not None:
            self.on_point(name, effect_id)

    # -- what an agent reads when it decides ----------------------------------------------------

    def read(self, path: str, at: str | None = None) -> str | None:
        """The text of ``path`` at ``at`` (default: the branch head), None if absent."""
        content = self._blobs(at or self.head(), [_norm_path(path)])[_norm_path(path)]
        return None if content is None else content.decode()

    def facts_for(
        self, request: EditRequest | Mapping[str, Any], at: str | None = None
    ) -> dict[str, Any]:
        """The facts ``request`` relies on, at ``at`` (the commit the agent read; default the
        branch head): record them as the request's ``premises`` when the agent decides."""
        edit = parse_edit(request)
        return self._facts_at(at or self.head(), edit.fact_keys())

    def with_premises(self, request: E, at: str | None = None) -> E:
        """``request`` carrying the facts it relies on (see ``facts_for``)."""
        return request.model_copy(update={"premises": self.facts_for(request, at)})

    # -- the target protocol ---------------------------------------------------------------------

    def _keys(self, edit: EditRequest) -> list[str]:
        return list(dict.fromkeys([*edit.fact_keys(), *(edit.premises or {})]))

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        """The facts now, at the branch head, without this effect's own contribution: where the
        effect's own commit is on the branch and a fact is as that commit left it, the value it
        had before that commit is reported."""
        edit = parse_edit(args)
        keys = self._keys(edit)
        head = self.head()
        now = self._facts_at(head, keys)
        own = self._own(effect_id, head)
        if not own:
            return now
        commit, parents = own[0]
        at_own = self._facts_at(commit, keys)
        before = self._facts_at(parents[0] if parents else None, keys)
        return {
            k: before[k] if now[k] == at_own[k] and at_own[k] != before[k] else now[k] for k in keys
        }

    def query(self, effect_id: str, args: Any) -> Found | None:
        """Tier 2: the commit on the branch whose trailer names this effect (found by the
        effect id alone: ``args`` is not needed)."""
        own = self._own(effect_id, self.ref)
        if not own:
            return None
        commit, parents = own[0]
        result = self._result_of(commit, parents, effect_id)
        return Found(result=result.model_dump(mode="json"), confirmation=commit)

    def validate(
        self, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
    ) -> list[Change]:
        """Field-by-field equality; each changed fact names the commit (and effect) that made
        it what it is now."""
        changes = default_validate(recorded, current)
        return self._provenance(changes, self.head()) if changes else changes

    def _provenance(self, changes: Sequence[Change], head: str) -> list[Change]:
        out = []
        for change in changes:
            where = _parse_fact(change.fact)
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
        where = _parse_fact(fact)
        assert where is not None
        path, qual = where
        history = self._log([f"-n{self.history_limit}", head, "--", path])
        contents = self._cat([f"{sha}:{path}" for sha, _, _ in history])
        found: tuple[str | None, str | None] = (None, None)
        for (sha, _, effects), content in zip(history, contents, strict=True):
            now = file_value(content) if qual is None else symbol_value(content, qual)
            if now != value:
                break
            found = (sha, effects[0] if effects else None)
        return found

    def confirmation(self, result: Any) -> str | None:
        commit = (
            result.get("commit") if isinstance(result, Mapping) else getattr(result, "commit", None)
        )
        return commit if isinstance(commit, str) else None

    def classify(self, error: BaseException) -> Classification:
        if isinstance(error, EditRejected):
            return "rejected"
        if isinstance(error, NotLanded):
            return "not_sent"
        return "in_doubt"

    # -- the send --------------------------------------------------------------------------------

    def apply(self, request: EditRequest | Mapping[str, Any], *, effect_id: str) -> CommitResult:
        """Make the edit as one commit on the branch, carrying the effect id as a trailer.

        Idempotent: if this effect's commit is on the branch already, that commit is returned.
        Raises ``PremiseChanged`` / ``EditDoesNotApply`` (rejected: nothing landed),
        ``NotLanded`` (nothing landed, may be retried) or ``LandingInDoubt``.
        """
        edit = parse_edit(request)
        head = self.head()
        own = self._own(effect_id, head)
        if own:
            return self._result_of(*own[0], effect_id)
        keys = self._keys(edit)
        # the baseline: what the agent relied on, or (no premises carried) the facts as the send
        # found them, which must then still hold at the head the commit is built on
        baseline = edit.premises if edit.premises is not None else self._facts_at(head, keys)
        message = _message(edit, effect_id)
        for attempt in range(1, self.max_attempts + 1):
            changes = default_validate(baseline, self._facts_at(head, keys))
            if changes:
                raise PremiseChanged(self._provenance(changes, head), head)
            tree, paths = self._build(edit, head)
            commit = self._out(["commit-tree", tree, "-p", head, "-F", "-"], stdin=message.encode())
            moved = self._swap(commit, head, effect_id)
            if moved is None:
                return CommitResult(
                    commit=commit,
                    branch=self.branch,
                    parent=head,
                    paths=paths,
                    effect_id=effect_id,
                    attempts=attempt,
                )
            # lost the race: did this effect land meanwhile (another attempt of it)? If not,
            # re-check the premises against the new head and build the edit again on it
            own = self._own(effect_id, f"{head}..{moved}")
            if own:
                return self._result_of(*own[0], effect_id)
            head = moved
        raise NotLanded(
            f"{self.ref} moved under each of {self.max_attempts} attempts; nothing landed"
        )

    def _swap(self, commit: str, expected: str, effect_id: str) -> str | None:
        """Compare-and-swap the branch from ``expected`` to ``commit``. None: it landed; else the
        commit the branch moved to meanwhile (nothing of ours landed)."""
        self._point("before_ref_update", effect_id)
        failure = ""
        for tries in range(8):
            try:
                proc = subprocess.run(
                    [
                        self.git,
                        "-C",
                        str(self.path),
                        "update-ref",
                        "-m",
                        f"interlock: {effect_id}",
                        self.ref,
                        commit,
                        expected,
                    ],
                    capture_output=True,
                    env=self._env,
                    timeout=self.timeout,
                    check=False,
                )
                code = proc.returncode
                failure = proc.stderr.decode(errors="replace").strip()
            except OSError as err:  # git never started: the ref was not touched
                raise GitCommandFailed("update-ref", f"{type(err).__name__}: {err}") from err
            except subprocess.SubprocessError as err:  # killed on timeout: read the ref back
                code, failure = -1, f"{type(err).__name__}"
            if code == 0:
                self._point("after_ref_update", effect_id)
                return None
            try:
                now = self.head()
                landed = now == commit or (
                    self._run(["merge-base", "--is-ancestor", commit, now], ok=(0, 1)).returncode
                    == 0
                )
            except GitCommandFailed as err:
                raise LandingInDoubt(
                    f"update-ref of {self.ref} failed ({failure}) and the ref cannot be read back"
                ) from err
            if landed:
                self._point("after_ref_update", effect_id)
                return None
            if now != expected:
                return now
            # the ref is still where we expected: another writer holds its lock; try again
            time.sleep(min(0.002 * (tries + 1), 0.05))
        raise NotLanded(
            f"could not update {self.ref} (it stayed at the expected commit): {failure}"
        )

    def _build(self, edit: EditRequest, head: str) -> tuple[str, list[str]]:
        """The tree of ``head`` with the edit made, on a temporary index (never the user's)."""
        with tempfile.TemporaryDirectory(prefix="interlock-git-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self._run(["read-tree", head], env=env)
            if isinstance(edit, ApplyPatch):
                try:
                    self._run(
                        ["apply", "--cached", "--whitespace=nowarn", "-"],
                        stdin=edit.patch.encode(),
                        env=env,
                    )
                except GitCommandFailed as err:
                    raise EditDoesNotApply(
                        f"the patch does not apply at {head[:12]}: {err.detail}"
                    ) from None
                names = self._run(["diff-index", "--cached", "--name-only", "-z", head], env=env)
                paths = sorted(p for p in names.stdout.decode().split("\0") if p)
            else:
                contents = self._edited(edit, head)
                modes = self._modes(head, list(contents))
                lines = []
                for path, data in contents.items():
                    blob = self._out(["hash-object", "-w", "--stdin"], stdin=data)
                    lines.append(f"{modes.get(path, '100644')} {blob}\t{path}\n")
                self._run(["update-index", "--index-info"], stdin="".join(lines).encode(), env=env)
                paths = sorted(contents)
            return self._out(["write-tree"], env=env), paths

    def _modes(self, head: str, paths: list[str]) -> dict[str, str]:
        out = self._run(["ls-tree", "-z", head, "--", *paths]).stdout.decode()
        modes = {}
        for entry in out.split("\0"):
            meta, _, path = entry.partition("\t")
            if path and meta.split()[1:2] == ["blob"]:
                modes[path] = meta.split()[0]
        return modes

    def _edited(self, edit: EditRequest, head: str) -> dict[str, bytes]:
        if isinstance(edit, WriteFile):
            return {edit.path: edit.content.encode()}
        if not isinstance(edit, DefineSymbol | ReplaceSymbol):  # pragma: no cover
            raise EditDoesNotApply(f"unknown edit {type(edit).__name__}")
        old = self._blobs(head, [edit.path])[edit.path]
        try:
            text = "" if old is None else old.decode()
            module = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            raise EditDoesNotApply(f"{edit.path} is not Python this worker can parse") from None
        node = _locate(module, edit.symbol)
        source = textwrap.dedent(edit.source).strip("\n") + "\n"
        if isinstance(edit, DefineSymbol):
            if node is not None:
                raise EditDoesNotApply(f"{edit.symbol} already exists in {edit.path}")
            new = (text.rstrip("\n") + "\n\n\n" if text.strip() else "") + source
        else:
            if node is None:
                raise EditDoesNotApply(f"{edit.symbol} does not exist in {edit.path}")
            lines = io.StringIO(text, newline="").readlines()
            decorators = getattr(node, "decorator_list", [])
            start = min([node.lineno, *(d.lineno for d in decorators)])
            end = node.end_lineno or node.lineno
            first = lines[start - 1]
            indent = first[: len(first) - len(first.lstrip(" \t"))]
            new = (
                "".join(lines[: start - 1]) + textwrap.indent(source, indent) + "".join(lines[end:])
            )
        data = new.encode()
        # the edit must have done what it says: the symbol now has exactly the given source
        want = symbol_value(source.encode(), edit.symbol.rsplit(".", 1)[-1])
        if symbol_value(data, edit.symbol) != want:
            raise EditDoesNotApply(f"{edit.symbol} could not be placed in {edit.path}")
        return {edit.path: data}


def parse_edit(value: Any) -> WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol:
    """An edit request from a model or its JSON data (as the journal records it)."""
    if isinstance(value, WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol):
        return value
    if isinstance(value, tuple | list) and len(value) == 1:
        value = value[0]
    try:
        return _EDIT.validate_python(value)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}"
            for e in err.errors(include_url=False, include_input=False, include_context=False)
        )
        raise EditRejected(f"not an edit request: {problems}") from None


def _message(edit: EditRequest, effect_id: str) -> str:
    text = (edit.message or edit.subject()).strip() or edit.subject()
    return f"{text}\n\n{TRAILER}: {effect_id}\n"
