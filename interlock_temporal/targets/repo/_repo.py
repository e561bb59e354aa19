"""``GitRepo``: a branch of a local git repository as an effect target (tier 2)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from ...core.models import Change, Found
from ...core.targets import BaseTarget, Classification, default_validate
from ._edits import E, EditRequest, parse_edit
from ._errors import EditRejected, NotLanded
from ._facts import _norm_path
from ._send import _Send

_GIT_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")


class GitRepo(_Send, BaseTarget):
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
