"""A git repository as a target (``interlock_temporal.targets.repo``), driven through ``Gate``.

Each test makes a real repository in ``tmp_path`` (the target's branch ``main`` is not checked
out: the worktree is detached) and reads every outcome from the repository itself: the branch
head, its history, the trailers of its commits and the files at its head. "Another engineer"
commits with ordinary porcelain (checkout, edit, ``git commit``) in the repository's worktree.
A crash is ``SimulatedCrash`` raised from the target's ``on_point`` hook inside the send; the next
attempt is a fresh ``Gate`` over a fresh journal connection.
"""

from __future__ import annotations

import ast
import asyncio
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal import receipt
from interlock_temporal.core.errors import Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Done, Gate, Ticket
from interlock_temporal.targets.repo import (
    ABSENT,
    ApplyPatch,
    CommitResult,
    DefineSymbol,
    EditDoesNotApply,
    EditRequest,
    GitCommandFailed,
    GitRepo,
    PremiseChanged,
    ReplaceSymbol,
    WriteFile,
    parse_edit,
    symbol_value,
)
from interlock_temporal.testing import SimulatedCrash, throwaway_journal

PRINCIPAL = "coder-bot"
ACTIVITY = "edit_repo"
TRAILER_FORMAT = "--format=%H%x1f%(trailers:key=Interlock-Effect,valueonly)%x1e"

UTIL = """\
def helper(text):
    return text.strip()
"""

# beta first, so reformatting it moves alpha's lines
MOD = """\
def beta(x,y): return x+y
def alpha():
    return "a"


def gamma():
    return 'g'
"""

BETA_REFORMATTED = """\
def beta(
    x,
    y,
):
    # add them
    return x + y



def alpha():
    return 'a'   # same code, other quotes and a comment


def gamma():
    return "g"
"""

APP = """\
from util import helper

print(helper(" hi "))
"""


# -- the repository, and another engineer working in it ----------------------------------------


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """No global or system git configuration leaks into the tests."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Another Engineer")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "eng@example.com")


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for name, text in (("util.py", UTIL), ("mod.py", MOD), ("app.py", APP)):
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "seed")
    git(repo, "checkout", "-q", "--detach")  # nobody has the target's branch checked out
    return repo


def engineer_commits(
    repo: Path,
    message: str,
    *,
    write: dict[str, str] | None = None,
    move: tuple[str, str] | None = None,
) -> str:
    """Another engineer commits on main in the worktree, with porcelain; returns the commit."""
    git(repo, "checkout", "-q", "main")
    try:
        if move is not None:
            git(repo, "mv", *move)
        for name, text in (write or {}).items():
            (repo / name).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        return git(repo, "rev-parse", "HEAD")
    finally:
        git(repo, "checkout", "-q", "--detach")


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "refs/heads/main")


def show(repo: Path, path: str, rev: str = "main") -> str:
    return git(repo, "show", f"{rev}:{path}")


def effects_on_main(repo: Path) -> dict[str, list[str]]:
    """effect id -> the commits on main whose Interlock-Effect trailer names it."""
    found: dict[str, list[str]] = {}
    for record in git(repo, "log", TRAILER_FORMAT, "main").split("\x1e"):
        sha, _, effects = record.strip().partition("\x1f")
        for eid in effects.split():
            found.setdefault(eid, []).append(sha)
    return found


def definitions(source: str, name: str) -> list[ast.stmt]:
    return [
        s
        for s in ast.parse(source).body
        if isinstance(s, ast.FunctionDef | ast.ClassDef) and s.name == name
    ]


# -- the gate ---------------------------------------------------------------------------------


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Callable[[], Journal]]:
    """Connections to one journal file; every chain verifies at the end of the test."""
    opened: list[Journal] = []
    lock = threading.Lock()

    def open_() -> Journal:
        j = throwaway_journal(tmp_path)
        with lock:
            opened.append(j)
        return j

    yield open_
    report = opened[0].verify() if opened else None
    for j in opened:
        j.close()
    if report is not None:
        assert report.ok, str(report)


@pytest.fixture
def journal(connect: Callable[[], Journal]) -> Journal:
    return connect()


@pytest.fixture
def lease(journal: Journal) -> str:
    return journal.leases.issue(PRINCIPAL, activities=[ACTIVITY])


@pytest.fixture
def repo(repo_dir: Path) -> GitRepo:
    return GitRepo(repo_dir, "main")


def call_for(edit: EditRequest, agent: str, decision: str, lease_id: str) -> Call:
    return Call(
        effect_type="repo_edit",
        activity=ACTIVITY,
        input=edit,
        args=(edit,),
        key={"agent": agent, "decision": decision},
        premises_field="premises",
        principal=PRINCIPAL,
        lease_id=lease_id,
        decode_args=lambda data: (parse_edit(data[0]),),
    )


def sender(repo: GitRepo) -> Callable[[Ticket], Any]:
    """The gated activity body: apply the approved edit, the effect id in the commit trailer."""

    async def send(ticket: Ticket) -> CommitResult:
        return repo.apply(ticket.input, effect_id=ticket.effect_id)

    return send


def eid_of(call: Call) -> str:
    return Gate.identify(call)[0]


def slugify(variant: str) -> DefineSymbol:
    return DefineSymbol(
        path="util.py",
        symbol="slugify",
        source=f"def slugify(text):\n    return text.lower().replace(' ', {variant!r})\n",
    )


NEW_ALPHA = "def alpha():\n    return 'A, rewritten'\n"


# -- symbol facts ---------------------------------------------------------------------------------


def test_a_symbol_fact_ignores_formatting_and_sees_code() -> None:
    alpha = symbol_value(MOD.encode(), "alpha")
    assert alpha.startswith("sha256:")
    # other quotes, a comment, other blank lines, and other lines before it: the same symbol
    assert symbol_value(BETA_REFORMATTED.encode(), "alpha") == alpha
    assert symbol_value(BETA_REFORMATTED.encode(), "beta") == symbol_value(MOD.encode(), "beta")
    # a change of its code, or of its decorators, is a change
    assert symbol_value(MOD.replace('"a"', '"b"').encode(), "alpha") != alpha
    decorated = MOD.replace("def alpha", "@cache\ndef alpha")
    assert symbol_value(decorated.encode(), "alpha") != alpha
    assert symbol_value(MOD.encode(), "delta") == ABSENT
    assert symbol_value(None, "alpha") == ABSENT
    assert symbol_value(b"def (:", "alpha").startswith("unparseable:")
    nested = b"class P:\n    def parse(self):\n        return 1\n    def other(self): pass\n"
    moved = (
        b"class P:\n\n    def other(self):\n        pass\n\n"
        b"    def parse(self):  # hm\n        return 1\n"
    )
    assert symbol_value(nested, "P.parse") == symbol_value(moved, "P.parse")
    assert symbol_value(nested, "P") != symbol_value(moved, "P")


# -- rename_break -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["renamed", "rewritten"])
async def test_rename_break(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str, how: str
) -> None:
    """The file the agent read changed under it before dispatch: refused, nothing lands."""
    edit = repo.with_premises(
        WriteFile(path="app.py", content=APP.replace(" hi ", " hello "), reads=["util.py"])
    )
    if how == "renamed":
        theirs = engineer_commits(repo_dir, "rename util", move=("util.py", "helpers.py"))
    else:
        theirs = engineer_commits(
            repo_dir, "rewrite util", write={"util.py": "def helper(text):\n    return text\n"}
        )

    call = call_for(edit, "agent-a", "greet louder", lease)
    with pytest.raises(Refused) as err:
        await Gate(journal).run(call, repo, sender(repo))

    assert err.value.code == "stale_premise"
    assert err.value.receipt.executed is False
    assert err.value.receipt.changed_facts == ["file:util.py"]
    change = err.value.changes[0]
    assert change.recorded == edit.premises["file:util.py"]  # type: ignore[index]
    assert change.current["commit"] == theirs  # names the commit that changed it
    assert (change.current["value"] == ABSENT) is (how == "renamed")
    # the repository: nothing landed
    assert head(repo_dir) == theirs
    assert show(repo_dir, "app.py") == APP.rstrip("\n")
    assert effects_on_main(repo_dir) == {}


# -- duplicate_work -----------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before_dispatch", "inside_send"])
async def test_duplicate_work(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str, when: str
) -> None:
    """Two agents define the same new function: one lands, the other's refusal names it.

    ``before_dispatch``: the gate's own check refuses the second. ``inside_send``: the second
    passed the gate's check before the first landed; the re-check inside the send refuses it."""
    base = head(repo_dir)
    first = call_for(repo.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    second = call_for(repo.with_premises(slugify("_")), "agent-b", "add slugify", lease)
    assert second.input.premises == {"symbol:util.py::slugify": ABSENT}

    ticket: Ticket | None = None
    if when == "inside_send":
        step = await Gate(journal).begin(second, repo)
        assert isinstance(step, Ticket)  # the gate's check passed: the symbol was absent
        ticket = step
    landed = await Gate(journal).run(first, repo, sender(repo))
    assert isinstance(landed, CommitResult)

    if ticket is None:
        with pytest.raises(Refused) as err:
            await Gate(journal).run(second, repo, sender(repo))
        assert err.value.code == "stale_premise"
        changes = err.value.changes
    else:
        with pytest.raises(PremiseChanged) as changed:
            repo.apply(ticket.input, effect_id=ticket.effect_id)
        assert repo.classify(changed.value) == "rejected"
        with pytest.raises(Refused) as err:
            await Gate(journal).fail(ticket, changed.value, last_attempt=False)
        # the send's own re-check found the fact moved: a stale premise, recorded with the
        # changed fact in the journal (and the refusal), not a bare target rejection
        assert err.value.code == "stale_premise"
        assert [c.fact for c in err.value.changes] == ["symbol:util.py::slugify"]
        assert err.value.receipt.changed_facts == ["symbol:util.py::slugify"]
        assert landed.commit[:12] in str(changed.value)
        changes = changed.value.changes
    assert err.value.receipt.executed is False
    assert [c.fact for c in changes] == ["symbol:util.py::slugify"]
    assert changes[0].recorded == ABSENT
    assert changes[0].current["commit"] == landed.commit  # the refusal names the first
    assert changes[0].current["effect"] == eid_of(first)
    # the repository: the first agent's definition, once; the second's nowhere
    assert head(repo_dir) == landed.commit
    assert git(repo_dir, "rev-parse", "main^") == base
    util = show(repo_dir, "util.py")
    assert len(definitions(util, "slugify")) == 1 and "'-'" in util and "'_'" not in util
    assert effects_on_main(repo_dir) == {eid_of(first): [landed.commit]}
    assert journal.row(eid_of(second)).status is Kind.REFUSED  # type: ignore[union-attr]


# -- benign_reformat ------------------------------------------------------------------------------


@pytest.mark.parametrize("premises", ["file", "symbol"])
async def test_benign_reformat(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str, premises: str
) -> None:
    """Another engineer reformats the file (another function, and the whitespace and quotes
    around the edited one) between the decision and the dispatch."""
    reads = ["mod.py"] if premises == "file" else []
    edit = repo.with_premises(
        ReplaceSymbol(path="mod.py", symbol="alpha", source=NEW_ALPHA, reads=reads)
    )
    theirs = engineer_commits(repo_dir, "format mod.py", write={"mod.py": BETA_REFORMATTED})
    call = call_for(edit, "agent-a", "rewrite alpha", lease)

    if premises == "file":
        with pytest.raises(Refused) as err:
            await Gate(journal).run(call, repo, sender(repo))
        assert err.value.code == "stale_premise"
        assert err.value.receipt.changed_facts == ["file:mod.py"]  # the symbol's premise held
        assert err.value.changes[0].current["commit"] == theirs
        assert head(repo_dir) == theirs
        assert show(repo_dir, "mod.py") == BETA_REFORMATTED.rstrip("\n")
        assert effects_on_main(repo_dir) == {}
        return

    result = await Gate(journal).run(call, repo, sender(repo))
    assert isinstance(result, CommitResult)
    assert result.parent == theirs and result.paths == ["mod.py"]
    # the repository: the edit sits on top of the reformat, and both are in the file
    assert head(repo_dir) == result.commit
    assert git(repo_dir, "rev-parse", "main^") == theirs
    mod = show(repo_dir, "mod.py") + "\n"
    assert mod == BETA_REFORMATTED.replace(
        "def alpha():\n    return 'a'   # same code, other quotes and a comment\n", NEW_ALPHA
    )
    assert effects_on_main(repo_dir) == {eid_of(call): [result.commit]}


# -- crash_before_commit --------------------------------------------------------------------------


def crash_at(point: str) -> Callable[[str, str], None]:
    def hook(name: str, effect_id: str) -> None:
        if name == point:
            raise SimulatedCrash(point)

    return hook


@pytest.mark.parametrize(
    "case", ["before_ref_update", "after_ref_update", "before_ref_update_then_taken"]
)
async def test_crash_before_commit(
    repo_dir: Path, connect: Callable[[], Journal], lease: str, case: str
) -> None:
    """The worker dies after DISPATCHED and before COMMITTED, before or after the ref update;
    the next attempt (a fresh gate, a fresh journal connection) recovers."""
    base = head(repo_dir)
    point = case.removesuffix("_then_taken")
    dying = GitRepo(repo_dir, "main", on_point=crash_at(point))
    call = call_for(dying.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    eid = eid_of(call)
    with pytest.raises(SimulatedCrash):
        await Gate(connect()).run(call, dying, sender(dying))

    journal = connect()
    assert journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]
    if point == "before_ref_update":
        assert head(repo_dir) == base and effects_on_main(repo_dir) == {}
    else:
        assert git(repo_dir, "rev-parse", "main^") == base
        assert effects_on_main(repo_dir) == {eid: [head(repo_dir)]}
    landed_by_crash = head(repo_dir)

    theirs = None
    if case.endswith("_then_taken"):  # meanwhile another agent defines the symbol
        by_hand = UTIL + "\n\ndef slugify(t):\n    return t\n"
        theirs = engineer_commits(repo_dir, "slugify by hand", write={"util.py": by_hand})

    repo = GitRepo(repo_dir, "main")
    if theirs is not None:
        with pytest.raises(Refused) as err:
            await Gate(journal).run(call, repo, sender(repo))
        assert err.value.code == "stale_premise_at_recovery"
        assert err.value.receipt.executed is False  # the query confirmed the absence
        assert err.value.changes[0].current["commit"] == theirs
        assert head(repo_dir) == theirs and effects_on_main(repo_dir) == {}
        return

    result = await Gate(journal).run(call, repo, sender(repo))
    r = receipt(eid, journal=journal)
    assert (r.final, r.executed) == ("COMMITTED", True)
    commits = effects_on_main(repo_dir)[eid]
    assert len(commits) == 1  # exactly one commit carries the effect
    if point == "before_ref_update":
        assert (r.via, r.dispatches) == ("recovery-reapply", 2)
        assert isinstance(result, CommitResult) and result.parent == base
    else:
        assert (r.via, r.dispatches) == ("recovery-query", 1)
        assert commits == [landed_by_crash]
        assert CommitResult.model_validate(result).commit == landed_by_crash
    assert r.confirmation == commits[0] == head(repo_dir)
    assert git(repo_dir, "rev-list", "--count", f"{base}..main") == "1"
    assert len(definitions(show(repo_dir, "util.py"), "slugify")) == 1


async def test_capture_leaves_out_this_effects_own_commit(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str
) -> None:
    call = call_for(repo.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    eid = eid_of(call)
    await Gate(journal).run(call, repo, sender(repo))
    engineer_commits(repo_dir, "unrelated", write={"app.py": APP + "# more\n"})

    key = "symbol:util.py::slugify"
    assert repo.capture(call.input, eid)[key] == ABSENT  # its own definition is not a change
    assert repo.capture(call.input, "f" * 64)[key] != ABSENT  # another effect sees it
    # once someone else changes what it defined, that is a change even for this effect
    edited = show(repo_dir, "util.py").replace("lower", "upper") + "\n"
    engineer_commits(repo_dir, "edit slugify", write={"util.py": edited})
    now = repo.capture(call.input, eid)[key]
    assert now == symbol_value(edited.encode(), "slugify") != ABSENT


# -- duplicate_submit -----------------------------------------------------------------------------


async def test_duplicate_submit(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str
) -> None:
    """The same edit submitted twice (the second even re-captured its premises after the first
    landed): one commit; the second returns the recorded result and sends nothing."""
    call = call_for(repo.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    first = await Gate(journal).run(call, repo, sender(repo))
    assert isinstance(first, CommitResult)
    after_first = head(repo_dir)

    resubmitted = call_for(repo.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    assert resubmitted.input.premises != call.input.premises  # the symbol exists by now
    step = await Gate(journal).begin(resubmitted, repo)
    assert isinstance(step, Done) and step.via == "duplicate"
    second = await Gate(journal).run(resubmitted, repo, sender(repo))
    assert CommitResult.model_validate(second) == first

    assert head(repo_dir) == after_first == first.commit
    assert effects_on_main(repo_dir) == {eid_of(call): [first.commit]}
    assert receipt(eid_of(call), journal=journal).dispatches == 1


# -- lease_revoked --------------------------------------------------------------------------------


async def test_lease_revoked(repo: GitRepo, repo_dir: Path, journal: Journal, lease: str) -> None:
    base = head(repo_dir)
    call = call_for(repo.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    assert journal.leases.revoke(lease)
    with pytest.raises(Refused) as err:
        await Gate(journal).run(call, repo, sender(repo))
    assert err.value.code == "lease"
    assert err.value.receipt.executed is False
    assert head(repo_dir) == base
    assert effects_on_main(repo_dir) == {}
    assert definitions(show(repo_dir, "util.py"), "slugify") == []


# -- what a failed send means --------------------------------------------------------------------


async def test_git_that_cannot_start_is_not_sent_and_the_next_attempt_lands(
    repo_dir: Path, journal: Journal, lease: str
) -> None:
    broken = GitRepo(repo_dir, "main")
    call = call_for(broken.with_premises(slugify("-")), "agent-a", "add slugify", lease)
    gate = Gate(journal)
    ticket = await gate.begin(call, broken)
    assert isinstance(ticket, Ticket)
    broken.git = str(repo_dir / "no-such-git")  # git cannot start inside the send
    with pytest.raises(GitCommandFailed) as err:
        broken.apply(ticket.input, effect_id=ticket.effect_id)
    assert broken.classify(err.value) == "not_sent"
    await gate.fail(ticket, err.value, last_attempt=False)  # recorded; Temporal would retry
    assert journal.row(eid_of(call)).status is Kind.NOT_SENT  # type: ignore[union-attr]

    repo = GitRepo(repo_dir, "main")
    result = await Gate(journal).run(call, repo, sender(repo))
    assert receipt(eid_of(call), journal=journal).via == "recovery-reapply"
    assert effects_on_main(repo_dir) == {eid_of(call): [result.commit]}


def patch_app(old: str, new: str) -> ApplyPatch:
    return ApplyPatch(
        patch=(
            "--- a/app.py\n+++ b/app.py\n@@ -1,3 +1,3 @@\n from util import helper\n \n"
            f'-print(helper("{old}"))\n+print(helper("{new}"))\n'
        ),
        message="louder greeting",
    )


async def test_a_patch_lands_and_one_whose_context_is_gone_is_rejected(
    repo: GitRepo, repo_dir: Path, journal: Journal, lease: str
) -> None:
    first = call_for(patch_app(" hi ", " hey "), "agent-a", "greet", lease)
    result = await Gate(journal).run(first, repo, sender(repo))
    assert result.paths == ["app.py"]
    assert show(repo_dir, "app.py") == APP.replace(" hi ", " hey ").rstrip("\n")
    assert git(repo_dir, "log", "-1", "--format=%s", "main") == "louder greeting"

    # a second agent's patch was written against the old line: git apply refuses it
    second = call_for(patch_app(" hi ", " yo "), "agent-b", "greet", lease)
    with pytest.raises(Refused) as err:
        await Gate(journal).run(second, repo, sender(repo))
    assert err.value.code == "target_rejected"
    assert isinstance(err.value.__context__, EditDoesNotApply)
    assert head(repo_dir) == result.commit
    assert effects_on_main(repo_dir) == {eid_of(first): [result.commit]}


# -- concurrency --------------------------------------------------------------------------------

N = 6


def run_agents(
    repo_dir: Path,
    connect: Callable[[], Journal],
    calls: list[Call],
) -> list[Any]:
    """Each agent in its own thread, with its own journal connection, gate and target. Every
    send builds its commit on the same head before any of them updates the branch (a barrier
    at the first ``before_ref_update`` of each), so all but one lose the first swap."""
    barrier = threading.Barrier(len(calls), timeout=20)
    waited: set[str] = set()
    lock = threading.Lock()

    def hold(point: str, effect_id: str) -> None:
        if point != "before_ref_update":
            return
        with lock:
            first = effect_id not in waited
            waited.add(effect_id)
        if first:
            barrier.wait()

    outcomes: list[Any] = [None] * len(calls)

    def agent(i: int) -> None:
        repo = GitRepo(repo_dir, "main", on_point=hold)
        gate = Gate(connect())
        try:
            outcomes[i] = asyncio.run(gate.run(calls[i], repo, sender(repo)))
        except Exception as err:
            outcomes[i] = err

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_concurrent_agents_on_different_symbols_all_land(
    repo_dir: Path, connect: Callable[[], Journal]
) -> None:
    many = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(N))
    base = engineer_commits(repo_dir, "many functions", write={"many.py": many})
    journal = connect()
    lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY])
    repo = GitRepo(repo_dir, "main")
    calls = [
        call_for(
            repo.with_premises(
                ReplaceSymbol(
                    path="many.py", symbol=f"f{i}", source=f"def f{i}():\n    return {i} * 100\n"
                )
            ),
            f"agent-{i}",
            f"scale f{i}",
            lease,
        )
        for i in range(N)
    ]
    outcomes = run_agents(repo_dir, connect, calls)

    assert all(isinstance(o, CommitResult) for o in outcomes), outcomes
    # all built on the same head; all but the first to swap were rebased at least once
    assert sum(o.attempts for o in outcomes) >= N + (N - 1)
    # the repository: N commits in a line on top of the base, each effect exactly once
    assert git(repo_dir, "rev-list", "--count", f"{base}..main") == str(N)
    assert git(repo_dir, "rev-list", "--merges", f"{base}..main") == ""
    assert (
        git(repo_dir, "rev-list", "--first-parent", f"{base}..main").split()
        == git(repo_dir, "rev-list", f"{base}..main").split()
    )
    landed = effects_on_main(repo_dir)
    assert {eid_of(c): len(landed.get(eid_of(c), [])) for c in calls} == {
        eid_of(c): 1 for c in calls
    }
    text = show(repo_dir, "many.py").encode()
    for i in range(N):  # no lost update: every agent's edit is in the file
        want = symbol_value(f"def f{i}():\n    return {i} * 100\n".encode(), f"f{i}")
        assert symbol_value(text, f"f{i}") == want
    for c in calls:
        assert journal.row(eid_of(c)).status is Kind.COMMITTED  # type: ignore[union-attr]


def test_concurrent_agents_on_one_symbol_one_lands(
    repo_dir: Path, connect: Callable[[], Journal]
) -> None:
    base = head(repo_dir)
    journal = connect()
    lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY])
    repo = GitRepo(repo_dir, "main")
    calls = [
        call_for(repo.with_premises(slugify(f"~{i}")), f"agent-{i}", "add slugify", lease)
        for i in range(N)
    ]
    outcomes = run_agents(repo_dir, connect, calls)

    won = [o for o in outcomes if isinstance(o, CommitResult)]
    lost = [o for o in outcomes if isinstance(o, Refused)]
    assert (len(won), len(lost)) == (1, N - 1), outcomes
    for refusal in lost:  # refused inside the send: the re-check against the moved branch
        assert refusal.code in ("stale_premise", "target_rejected")
        assert refusal.receipt.executed is False
        cause = refusal.__context__
        assert isinstance(cause, PremiseChanged)
        assert cause.changes[0].current["commit"] == won[0].commit
    # the repository: one commit on the base, one definition, one effect
    assert head(repo_dir) == won[0].commit
    assert git(repo_dir, "rev-list", "--count", f"{base}..main") == "1"
    assert len(definitions(show(repo_dir, "util.py"), "slugify")) == 1
    landed = effects_on_main(repo_dir)
    assert sorted(landed) == [won[0].effect_id] and landed[won[0].effect_id] == [won[0].commit]


def test_every_parse_of_python_takes_the_one_lock() -> None:
    """CPython 3.11's AST converter keeps its recursion depth in state all threads share: two
    activities parsing at once failed with "AST constructor recursion depth mismatch" (CPython
    gh-106905; seen once in CI). Every parse in the package goes through ``parse_python``."""
    package = Path(__file__).resolve().parent.parent / "interlock_temporal"
    raw = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "ast.parse(" in line and "``ast.parse``" not in line
    ]
    assert len(raw) == 1 and raw[0].startswith("targets/repo/_facts.py:"), raw
