"""``GitRepo``: a branch of a local git repository as an effect target (tier 2)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from ...core.models import Change, Found
from ...core.targets import BaseTarget, Classification, default_validate
from ._branch import Branch, fact_keys
from ._edits import CommitResult, E, EditRequest, parse_edit
from ._errors import EditRejected, NotLanded
from ._facts import norm_path
from ._send import Sender


class _Setting:
    """A setting of the repo's ``Branch`` or ``Sender`` (``part``), read and set on the
    ``GitRepo`` as before they were its parts' (``repo.git = ...`` reaches the branch)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, repo: Any, owner: type | None = None) -> Any:
        return self if repo is None else getattr(getattr(repo, self.part), self.name)

    def __set__(self, repo: Any, value: Any) -> None:
        setattr(getattr(repo, self.part), self.name, value)


class GitRepo(BaseTarget):
    """A branch of a local git repository, as an effect target (tier 2) and as the send. It
    holds the ``Branch`` (git) and the ``Sender`` (``apply``), which shares that branch.

    ``on_point(point, effect_id)`` is called at ``"before_ref_update"`` and
    ``"after_ref_update"`` (tests raise ``SimulatedCrash`` there, as a dying worker would).
    """

    tier = 2
    dedupe_window: timedelta | None = None
    git = _Setting("_branch")
    timeout = _Setting("_branch")
    history_limit = _Setting("_branch")
    on_point = _Setting("_branch")
    max_attempts = _Setting("_sender")

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
        self.name = name
        self.settle_time = settle_time
        self._branch = Branch(
            Path(path),
            branch,
            author=author,
            history_limit=history_limit,
            timeout=timeout,
            git=git,
            on_point=on_point,
        )
        self._sender = Sender(self._branch, max_attempts)
        self._branch.run(["check-ref-format", self._branch.ref])
        if self._branch.rev(self._branch.ref) is None:
            raise ValueError(f"{self.path}: branch {branch!r} does not exist (make a first commit)")

    def __repr__(self) -> str:
        return f"GitRepo({str(self.path)!r}, branch={self.branch!r})"

    @property
    def path(self) -> Path:
        return self._branch.path

    @property
    def branch(self) -> str:
        return self._branch.branch

    @property
    def ref(self) -> str:
        return self._branch.ref

    def head(self) -> str:
        """The commit the branch points at now."""
        return self._branch.head()

    def landed(self, effect_id: str) -> list[str]:
        """Every commit on the branch carrying this effect's trailer (exactly one, if landed)."""
        return self._branch.landed(effect_id)

    def apply(self, request: EditRequest | Mapping[str, Any], *, effect_id: str) -> CommitResult:
        """Make the edit as one commit on the branch, carrying the effect id as a trailer.

        Idempotent: if this effect's commit is on the branch already, that commit is returned.
        Raises ``PremiseChanged`` / ``EditDoesNotApply`` (rejected: nothing landed),
        ``NotLanded`` (nothing landed, may be retried) or ``LandingInDoubt``.
        """
        return self._sender.apply(request, effect_id=effect_id)

    # -- what an agent reads when it decides ----------------------------------------------------

    def read(self, path: str, at: str | None = None) -> str | None:
        """The text of ``path`` at ``at`` (default: the branch head), None if absent."""
        content = self._branch.blobs(at or self.head(), [norm_path(path)])[norm_path(path)]
        return None if content is None else content.decode()

    def facts_for(
        self, request: EditRequest | Mapping[str, Any], at: str | None = None
    ) -> dict[str, Any]:
        """The facts ``request`` relies on, at ``at`` (the commit the agent read; default the
        branch head): record them as the request's ``premises`` when the agent decides."""
        edit = parse_edit(request)
        return self._branch.facts_at(at or self.head(), edit.fact_keys())

    def with_premises(self, request: E, at: str | None = None) -> E:
        """``request`` carrying the facts it relies on (see ``facts_for``)."""
        return request.model_copy(update={"premises": self.facts_for(request, at)})

    # -- the target protocol ---------------------------------------------------------------------

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        """The facts now, at the branch head, without this effect's own contribution: where the
        effect's own commit is on the branch and a fact is as that commit left it, the value it
        had before that commit is reported."""
        edit = parse_edit(args)
        keys = fact_keys(edit)
        head = self.head()
        now = self._branch.facts_at(head, keys)
        own = self._branch.own(effect_id, head)
        if not own:
            return now
        commit, parents = own[0]
        at_own = self._branch.facts_at(commit, keys)
        before = self._branch.facts_at(parents[0] if parents else None, keys)
        return {
            k: before[k] if now[k] == at_own[k] and at_own[k] != before[k] else now[k] for k in keys
        }

    def query(self, effect_id: str, args: Any) -> Found | None:
        """Tier 2: the commit on the branch whose trailer names this effect (found by the
        effect id alone: ``args`` is not needed)."""
        own = self._branch.own(effect_id, self.ref)
        if not own:
            return None
        commit, parents = own[0]
        result = self._branch.result_of(commit, parents, effect_id)
        return Found(result=result.model_dump(mode="json"), confirmation=commit)

    def validate(
        self, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
    ) -> list[Change]:
        """Field-by-field equality; each changed fact names the commit (and effect) that made
        it what it is now."""
        changes = default_validate(recorded, current)
        return self._branch.provenance(changes, self.head()) if changes else changes

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
