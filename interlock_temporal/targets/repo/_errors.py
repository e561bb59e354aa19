"""What ``GitRepo.apply`` raises, by what each means for a resend (``GitRepo.classify``)."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.models import Change


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
