"""The send (``Sender``, ``GitRepo.apply``): one commit on the branch, carrying the effect id as
a trailer, built on a temporary index and landed with a compare-and-swap of the branch ref."""

from __future__ import annotations

import io
import tempfile
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.targets import default_validate
from ._branch import Branch, fact_keys
from ._edits import (
    ApplyPatch,
    CommitResult,
    DefineSymbol,
    EditRequest,
    ReplaceSymbol,
    WriteFile,
    parse_edit,
)
from ._errors import EditDoesNotApply, GitCommandFailed, LandingInDoubt, NotLanded, PremiseChanged
from ._facts import TRAILER, locate, parse_python, symbol_value


class Sender:
    """Lands an edit on ``branch`` as one commit, rebuilding it on a moved head at most
    ``max_attempts`` times."""

    def __init__(self, branch: Branch, max_attempts: int) -> None:
        self._branch = branch
        self.max_attempts = max_attempts

    def apply(self, request: EditRequest | Mapping[str, Any], *, effect_id: str) -> CommitResult:
        """Make the edit as one commit on the branch, carrying the effect id as a trailer.

        Idempotent: if this effect's commit is on the branch already, that commit is returned.
        Raises ``PremiseChanged`` / ``EditDoesNotApply`` (rejected: nothing landed),
        ``NotLanded`` (nothing landed, may be retried) or ``LandingInDoubt``.
        """
        edit = parse_edit(request)
        branch = self._branch
        head = branch.head()
        own = branch.own(effect_id, head)
        if own:
            return branch.result_of(*own[0], effect_id)
        keys = fact_keys(edit)
        # the baseline: what the agent relied on, or (no premises carried) the facts as the send
        # found them, which must then still hold at the head the commit is built on
        baseline = edit.premises if edit.premises is not None else branch.facts_at(head, keys)
        message = _message(edit, effect_id)
        for attempt in range(1, self.max_attempts + 1):
            changes = default_validate(baseline, branch.facts_at(head, keys))
            if changes:
                raise PremiseChanged(branch.provenance(changes, head), head)
            tree, paths = self._build(edit, head)
            commit = branch.out(
                ["commit-tree", tree, "-p", head, "-F", "-"], stdin=message.encode()
            )
            moved = self._swap(commit, head, effect_id)
            if moved is None:
                return CommitResult(
                    commit=commit,
                    branch=branch.branch,
                    parent=head,
                    paths=paths,
                    effect_id=effect_id,
                    attempts=attempt,
                )
            # lost the race: did this effect land meanwhile (another attempt of it)? If not,
            # re-check the premises against the new head and build the edit again on it
            own = branch.own(effect_id, f"{head}..{moved}")
            if own:
                return branch.result_of(*own[0], effect_id)
            head = moved
        raise NotLanded(
            f"{branch.ref} moved under each of {self.max_attempts} attempts; nothing landed"
        )

    def _swap(self, commit: str, expected: str, effect_id: str) -> str | None:
        """Compare-and-swap the branch from ``expected`` to ``commit``. None: it landed; else the
        commit the branch moved to meanwhile (nothing of ours landed)."""
        branch = self._branch
        branch.point("before_ref_update", effect_id)
        failure = ""
        for tries in range(8):
            code, failure = branch.update_ref(commit, expected, f"interlock: {effect_id}")
            if code == 0:
                branch.point("after_ref_update", effect_id)
                return None
            try:
                now = branch.head()
                landed = now == commit or (
                    branch.run(["merge-base", "--is-ancestor", commit, now], ok=(0, 1)).returncode
                    == 0
                )
            except GitCommandFailed as err:
                raise LandingInDoubt(
                    f"update-ref of {branch.ref} failed ({failure}) and the ref cannot be read back"
                ) from err
            if landed:
                branch.point("after_ref_update", effect_id)
                return None
            if now != expected:
                return now
            # the ref is still where we expected: another writer holds its lock; try again
            time.sleep(min(0.002 * (tries + 1), 0.05))
        raise NotLanded(
            f"could not update {branch.ref} (it stayed at the expected commit): {failure}"
        )

    def _build(self, edit: EditRequest, head: str) -> tuple[str, list[str]]:
        """The tree of ``head`` with the edit made, on a temporary index (never the user's)."""
        git = self._branch
        with tempfile.TemporaryDirectory(prefix="interlock-git-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git.run(["read-tree", head], env=env)
            if isinstance(edit, ApplyPatch):
                try:
                    git.run(
                        ["apply", "--cached", "--whitespace=nowarn", "-"],
                        stdin=edit.patch.encode(),
                        env=env,
                    )
                except GitCommandFailed as err:
                    raise EditDoesNotApply(
                        f"the patch does not apply at {head[:12]}: {err.detail}"
                    ) from None
                names = git.run(["diff-index", "--cached", "--name-only", "-z", head], env=env)
                paths = sorted(p for p in names.stdout.decode().split("\0") if p)
            else:
                contents = self._edited(edit, head)
                modes = self._modes(head, list(contents))
                lines = []
                for path, data in contents.items():
                    blob = git.out(["hash-object", "-w", "--stdin"], stdin=data)
                    lines.append(f"{modes.get(path, '100644')} {blob}\t{path}\n")
                git.run(["update-index", "--index-info"], stdin="".join(lines).encode(), env=env)
                paths = sorted(contents)
            return git.out(["write-tree"], env=env), paths

    def _modes(self, head: str, paths: list[str]) -> dict[str, str]:
        out = self._branch.run(["ls-tree", "-z", head, "--", *paths]).stdout.decode()
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
        old = self._branch.blobs(head, [edit.path])[edit.path]
        try:
            text = "" if old is None else old.decode()
            module = parse_python(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            raise EditDoesNotApply(f"{edit.path} is not Python this worker can parse") from None
        node = locate(module, edit.symbol)
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


def _message(edit: EditRequest, effect_id: str) -> str:
    text = (edit.message or edit.subject()).strip() or edit.subject()
    return f"{text}\n\n{TRAILER}: {effect_id}\n"
