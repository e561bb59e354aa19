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

Tier 2: ``query`` finds the commit carrying the trailer on the branch. There is no
dedupe window, and a local repository's ``settle_time`` defaults to 0 (a commit is there at once
or not at all).

Point the target at a branch nobody has checked out (or at a bare repository): the branch moves
under a worktree that has it checked out, and that worktree's ``git commit -a`` would undo the
agents' edits.
"""

from ._edits import (
    AnyEdit,
    ApplyPatch,
    CommitResult,
    DefineSymbol,
    EditRequest,
    ReplaceSymbol,
    WriteFile,
    parse_edit,
)
from ._errors import (
    EditDoesNotApply,
    EditRejected,
    GitCommandFailed,
    LandingInDoubt,
    NotLanded,
    PremiseChanged,
    RepoError,
)
from ._facts import ABSENT, TRAILER, file_fact, symbol_fact, symbol_value
from ._repo import GitRepo

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
