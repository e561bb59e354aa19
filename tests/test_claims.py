"""Host claims, both kinds (range locks in one file, and a lock file per effect): exclusive per
effect, across threads and processes, released when the holder dies (SIGKILL included, and with
a forked child still alive), no time-to-live and no files left behind."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal.claims import Claims, FileClaims, RangeClaims, host_claims

EID = effect_id("claims.refund", {"case": 1})
OTHER = effect_id("claims.refund", {"case": 2})

HOLDER = """
import os, sys, time
from pathlib import Path
from interlock_temporal.core.journal import claims as kinds
claims = getattr(kinds, sys.argv[4])(Path(sys.argv[1]))
claim = claims.try_claim(sys.argv[2])
if sys.argv[3] == "fork-then-hold":
    # a child that outlives its parent; "held" waits until the child is running, which is after
    # its at-fork handlers have run (until then it shares the parent's locks)
    started, running = os.pipe()
    if os.fork() == 0:
        os.write(running, b"!")
        time.sleep(60)
        os._exit(0)
    os.close(running)
    assert os.read(started, 1) == b"!"
print("held" if claim is not None else "busy", flush=True)
if sys.argv[3] == "wait-for-stdin":
    sys.stdin.readline()
    if claim is not None:
        claim.release()
    print("released", flush=True)
else:
    time.sleep(60)
"""

KINDS = {"range": RangeClaims, "file": FileClaims}


@pytest.fixture
def claims_dir(tmp_path: Path) -> Path:
    return tmp_path / "claims"


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def claims(claims_dir: Path, kind: str) -> Iterator[Claims]:
    claims: Claims = KINDS[kind](claims_dir)
    yield claims
    claims.close()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes to clean up whatever the test does."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def spawn_holder(
    children: list[subprocess.Popen[str]], directory: Path, eid: str, mode: str, kind: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), eid, mode, KINDS[kind].__name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children.append(proc)
    return proc


def read_line(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError("the child said nothing in time")
    line = proc.stdout.readline().strip()
    if not line:
        assert proc.stderr is not None
        raise AssertionError(f"the child exited: {proc.stderr.read()}")
    return line


def lock_files(directory: Path) -> list[str]:
    """The files a claim leaves: per effect (range claims share one file, which is not counted)."""
    return sorted(p.name for p in directory.iterdir() if p.name != RangeClaims.FILE)


def held_files(kind: str, *eids: str) -> list[str]:
    """The files that exist while ``eids`` are held."""
    return sorted(f"{eid}.lock" for eid in eids) if kind == "file" else []


def test_this_host_uses_range_locks(claims_dir: Path) -> None:
    # these machines are Linux: the fast kind is the one the journal uses
    assert isinstance(host_claims(claims_dir), RangeClaims)
    assert (claims_dir / RangeClaims.FILE).exists()


# -- one process ---------------------------------------------------------------------------


def test_exclusive_within_a_process(claims: Claims) -> None:
    first = claims.try_claim(EID)
    assert first is not None
    assert first.effect_id == EID
    for _ in range(3):
        assert claims.try_claim(EID) is None
    assert claims.is_claimed(EID)
    other = claims.try_claim(OTHER)  # other effects are independent
    assert other is not None
    first.release()
    assert not claims.is_claimed(EID)
    again = claims.try_claim(EID)
    assert again is not None
    assert claims.try_claim(EID) is None
    again.release()
    other.release()


def test_two_claim_sets_on_one_directory_exclude_each_other(claims_dir: Path, kind: str) -> None:
    one, two = KINDS[kind](claims_dir), KINDS[kind](claims_dir)
    held = one.try_claim(EID)
    assert held is not None
    assert two.try_claim(EID) is None
    assert two.is_claimed(EID)
    held.release()
    taken = two.try_claim(EID)
    assert taken is not None
    assert one.try_claim(EID) is None
    taken.release()


def test_release_removes_the_lock_file(claims: Claims, claims_dir: Path, kind: str) -> None:
    claim = claims.try_claim(EID)
    assert claim is not None
    assert lock_files(claims_dir) == held_files(kind, EID)
    claim.release()
    assert lock_files(claims_dir) == []
    claim.release()  # a second release is harmless and frees nothing else
    held = claims.try_claim(EID)
    assert held is not None
    claim.release()
    assert claims.try_claim(EID) is None
    held.release()

    with claims.try_claim(EID) as scoped:  # type: ignore[union-attr]
        assert scoped is not None
        assert claims.try_claim(EID) is None
    assert lock_files(claims_dir) == []
    assert not claims.is_claimed(EID)


def test_many_cycles_leave_no_files(claims: Claims, claims_dir: Path, kind: str) -> None:
    ids = [effect_id("claims.cycle", n) for n in range(50)]
    for _ in range(4):
        held = [claims.try_claim(eid) for eid in ids]
        assert all(c is not None for c in held)
        assert all(claims.is_claimed(eid) for eid in ids)
        assert lock_files(claims_dir) == held_files(kind, *ids)
        for claim in held:
            assert claim is not None
            claim.release()
        assert lock_files(claims_dir) == []
    for eid in ids:
        assert not claims.is_claimed(eid)  # probing takes and gives back
    assert lock_files(claims_dir) == []


def test_a_thread_race_on_one_effect_has_exactly_one_holder(claims_dir: Path, kind: str) -> None:
    # two claim sets on the same directory: the in-process lock and the kernel's both matter
    sets = [KINDS[kind](claims_dir), KINDS[kind](claims_dir)]
    threads_n = 12
    for _ in range(15):
        barrier = threading.Barrier(threads_n)
        got: list[object] = [None] * threads_n

        def take(i: int, barrier: threading.Barrier = barrier, got: list[object] = got) -> None:
            barrier.wait()
            got[i] = sets[i % 2].try_claim(EID)

        threads = [threading.Thread(target=take, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        holders = [c for c in got if c is not None]
        assert len(holders) == 1, got
        holders[0].release()  # type: ignore[attr-defined]
    assert lock_files(claims_dir) == []


def test_effect_ids_must_be_plain_hex(claims: Claims, claims_dir: Path) -> None:
    for bad in ("../escape", "a/b", "", "ab.cd", "x y"):
        with pytest.raises(ValueError):
            claims.try_claim(bad)
    assert lock_files(claims_dir) == []
    assert not (claims_dir.parent / "escape.lock").exists()


# -- several processes ---------------------------------------------------------------------------


def test_exclusive_across_processes(
    claims: Claims, claims_dir: Path, kind: str, children: list[subprocess.Popen[str]]
) -> None:
    mine = claims.try_claim(OTHER)
    assert mine is not None
    child = spawn_holder(children, claims_dir, EID, "wait-for-stdin", kind)
    # and the other way round: what the parent holds, a child cannot take
    rival = spawn_holder(children, claims_dir, OTHER, "wait-for-stdin", kind)
    assert read_line(child) == "held"
    assert claims.try_claim(EID) is None
    assert claims.is_claimed(EID)
    assert read_line(rival) == "busy"

    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert read_line(child) == "released"
    assert child.wait(timeout=10) == 0
    taken = claims.try_claim(EID)
    assert taken is not None
    taken.release()
    mine.release()


@pytest.mark.parametrize("mode", ["hold", "fork-then-hold"])
def test_released_when_the_holder_is_sigkilled(
    claims: Claims, claims_dir: Path, kind: str, mode: str, children: list[subprocess.Popen[str]]
) -> None:
    child = spawn_holder(children, claims_dir, EID, mode, kind)
    assert read_line(child) == "held"
    assert claims.try_claim(EID) is None
    assert claims.is_claimed(EID)

    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL
    # the holder never cleaned up (and in "fork-then-hold" its forked child lives on): what it
    # left on disk is still there, yet its lock is gone
    assert lock_files(claims_dir) == held_files(kind, EID)
    assert not claims.is_claimed(EID)
    claim = claims.try_claim(EID)
    assert claim is not None
    assert claims.try_claim(EID) is None
    claim.release()
    assert lock_files(claims_dir) == []


CHURN = """
import os, sys, time
from pathlib import Path
from interlock_temporal.core.journal import claims as kinds
directory, eid, log, go, seconds, kind = sys.argv[1:7]
claims = getattr(kinds, kind)(Path(directory))
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
open(go + ".ready." + str(os.getpid()), "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
end = time.monotonic() + float(seconds)
held = 0
while time.monotonic() < end:
    claim = claims.try_claim(eid)
    if claim is None:
        continue
    os.write(fd, f"in {os.getpid()}\\n".encode())
    time.sleep(0.0005)
    os.write(fd, f"out {os.getpid()}\\n".encode())
    claim.release()
    held += 1
    time.sleep(0.0005)
print(held)
"""


def test_no_two_processes_hold_a_claim_at_once_under_churn(
    tmp_path: Path, claims_dir: Path, kind: str, children: list[subprocess.Popen[str]]
) -> None:
    # claim, release and unlink race each other here: a process that opened the lock file just
    # before its holder unlinked it must not think it holds the claim
    claims_dir.mkdir()
    log, go = tmp_path / "log", tmp_path / "go"
    procs = []
    for _ in range(3):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHURN,
                *(str(claims_dir), EID, str(log), str(go), "0.5", KINDS[kind].__name__),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        children.append(proc)
        procs.append(proc)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready.*"))) < len(procs):
        assert time.monotonic() < deadline
        assert all(p.poll() is None for p in procs)
        time.sleep(0.005)
    go.touch()
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        counts.append(int(out))

    lines = log.read_text().splitlines()
    assert len(lines) == 2 * sum(counts)
    assert sum(counts) >= 20
    holders = set()
    for i in range(0, len(lines), 2):
        entered, left = lines[i].split(), lines[i + 1].split()
        assert entered[0] == "in", lines[i : i + 2]
        assert left == ["out", entered[1]], lines[i : i + 2]
        holders.add(entered[1])
    assert len(holders) >= 2  # the claim really moved between processes
    assert lock_files(claims_dir) == []
