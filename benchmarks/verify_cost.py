"""Figure 5: how fast an auditor verifies a journal.

A journal of ``entries`` real-shaped entries is built once: the entries of one effect the gate
really wrote (PROPOSED, AUTHORIZED, DISPATCHED, COMMITTED, with their premises, lease snapshot
and delivery) are re-encoded and signed for each new effect id, and bulk-inserted (building it
through the gate would take minutes and is measured by figure 1). Then ``Journal.verify()``
reads and checks every entry (hash, signature, chain, sequence), timed end to end, several
times; the same for ``interlock journal verify`` as a process, and for an Ed25519-signed
journal, which verifies with a public key alone but pays for the asymmetric check.

What bounds it is measured on the HMAC journal in the same process: the same reads alone, then
with each entry's sha256, then with its HMAC too, and the JSON of each effect's first entry
(its delivery and type are checked against the effects table); the rest of a verify is the
Python that compares columns, chains, values and rows. ``cryptography`` verifies one Ed25519
signature per call (``Ed25519PublicKey.verify``): it has no batch verification, so each entry
pays one whole asymmetric check; the check lets other threads run, so a verify makes them on
one thread per core.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.journal import Journal, encode_entry, open_journal
from interlock_temporal.core.journal.signing import Ed25519Key, HmacKey
from interlock_temporal.core.journal.verify_jobs import default_jobs
from interlock_temporal.core.journal.verifying import first_facts
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Gate, Measure

from . import bench_dir

HMAC_KEY = "42" * 32
ED25519_SEED = "43" * 32
#: issue 39: HMAC, with ``--jobs`` on every core of the machine (2 in CI)
TARGET_PER_S = 250_000
#: rows held in memory to time hashing, signatures and JSON alone
SAMPLE = 50_000


@dataclass(frozen=True)
class VerifyRun:
    scheme: str
    entries: int
    seconds: list[float]
    cli_seconds: float | None
    #: ``verify(jobs=...)``: the processes asked for (and ``used``, as the report says)
    jobs: int = 1
    used: int = 1

    @property
    def best_per_s(self) -> float:
        return self.entries / min(self.seconds)

    @property
    def median_per_s(self) -> float:
        ordered = sorted(self.seconds)
        return self.entries / ordered[len(ordered) // 2]


@dataclass(frozen=True)
class VerifyCost:
    runs: list[VerifyRun]
    bytes_per_entry: float
    build_seconds: float
    #: where an HMAC verify's time goes, µs per entry: "read" (the rows from SQLite), "sha256"
    #: (of the signed bytes), "hmac", "first entries' JSON", "the rest" (the median verify less
    #: those)
    bounds: dict[str, float] | None = None
    #: µs per Ed25519 signature check alone (``cryptography``, one call per signature)
    ed25519_check_us: float | None = None


class _Target:
    name = "bench-verify"
    dedupe_window = None
    settle_time = timedelta(0)

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {"order_paid_cents": 10_000, "refunded_cents": 0, "eligible": True}


def _template(journal: Journal) -> list[tuple[Kind, dict[str, Any], str | None, int]]:
    """The entries the gate writes for one committed refund in ``journal`` (its lease issued
    first: a DISPATCHED signs the head of its lease's chain, which ``verify`` checks against
    that chain, so the lease lives in the journal being built), as stored: (kind, data, the
    values stored beside it as the journal stores them, the entry's format)."""
    lease = journal.leases.issue("bench-bot", activities=["refund"], max_amount_cents=5_000)
    payload = {"case_id": "4471", "order_id": "A-1001", "amount_cents": 2_000}
    call = Call(
        effect_type="refund",
        activity="refund",
        input=payload,
        args=(payload,),
        key={"case": "4471", "order": "A-1001"},
        principal="bench-bot",
        lease_id=lease,
        session="support-case-4471",
        measure=lambda args: Measure(2_000),
    )

    async def send(ticket: Any) -> dict[str, Any]:
        return {"refund_id": "re_3Pq8xY2eZvKYlo2C1a2b3c4d", "amount_cents": 2_000}

    gate = Gate(journal)
    asyncio.run(gate.run(call, _Target(), send))
    (row,) = journal.effects()
    return [
        (Kind(r.kind), doc["data"], r.vals, doc["v"])
        for r in journal.iter_raw()
        if r.effect_id == row.effect_id and (doc := json.loads(r.body))
    ]


def _build(path: Path, signing_key: str, key: HmacKey | Ed25519Key, entries: int) -> float:
    """A journal of about ``entries`` signed entries: its lease and one effect the gate writes
    (``_template``), then that effect's entries re-encoded for new effect ids and signed with
    ``key``, written straight into the journal's tables."""
    journal = open_journal(f"sqlite:///{path}", signing_key=signing_key)  # creates the schema
    template = _template(journal)
    seq = max(r.seq for r in journal.iter_raw())
    journal.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    written = seq
    size = 0
    now = time.time()
    batch: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    effects = (entries - written) // len(template)
    for n in range(effects):
        eid = hashlib.sha256(f"bench effect {n}".encode()).hexdigest()
        prev, prev_seq = "", None
        # as the gate writes them: its dispatch (PROPOSED, AUTHORIZED and DISPATCHED as one
        # entry since schema 14) in one transaction, COMMITTED in the next; the index row says
        # what the entries add up to
        dispatched = now + n * 1e-3
        committed = dispatched + 1e-4
        for kind, data, vals, version in template:
            seq += 1
            e = encode_entry(
                seq=seq,
                ts=committed if kind is Kind.COMMITTED else dispatched,
                effect_id=eid,
                kind=kind,
                prev=prev,
                key=key,
                data=data,
                vals=vals,
                version=version,
            )
            size += len(e.body)
            columns = (e.seq, e.effect_id, e.kind.value, e.prev, e.hash, e.key_id, e.sig)
            batch.append((*columns, e.body, vals, prev_seq))
            prev, prev_seq = e.hash, e.seq
        rows.append((eid, "refund", "COMMITTED", prev, seq, committed, dispatched, dispatched))
        if len(batch) >= 20_000:
            _flush(db, batch, rows)
    _flush(db, batch, rows)
    db.close()
    return size / max(seq - written, 1)


def _flush(db: sqlite3.Connection, batch: list[Any], rows: list[Any]) -> None:
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body, vals, "
        "prev_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        batch,
    )
    db.executemany(
        "INSERT INTO effects (effect_id, effect_type, status, head, head_seq, updated_ts, "
        "first_dispatch_ts, last_dispatch_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    db.execute("COMMIT")
    batch.clear()
    rows.clear()


def _time_verify(
    path: Path, repeats: int, jobs: int = 1, **keys: Any
) -> tuple[list[float], int, int]:
    """Each run's seconds, the entries, and how many processes checked them."""
    seconds = []
    count = used = 0
    for _ in range(repeats):
        journal = open_journal(f"sqlite:///{path}", create=False, check_tail=False, **keys)
        started = time.perf_counter()
        report = journal.verify(jobs=jobs)
        seconds.append(time.perf_counter() - started)
        journal.close()
        if not report.ok:
            raise RuntimeError(f"the benchmark journal does not verify: {report}")
        count, used = report.entries, report.jobs
    return seconds, count, used


def _runs(
    scheme: str, path: Path, repeats: int, jobs: list[int], cli: float, **keys: Any
) -> list[VerifyRun]:
    """One run per number of processes, in turns (1, 2, ..., 1, 2, ...) so that each sees the
    same machine; the command's time beside the one that uses every core."""
    times: dict[int, list[float]] = {n: [] for n in jobs}
    counts: dict[int, tuple[int, int]] = {}
    for _ in range(repeats):
        for n in jobs:
            seconds, count, used = _time_verify(path, 1, n, **keys)
            times[n] += seconds
            counts[n] = (count, used)
    return [
        VerifyRun(scheme, counts[n][0], times[n], cli if n == max(jobs) else None, n, counts[n][1])
        for n in jobs
    ]


def _bounds(path: Path, verify_seconds: float, entries: int) -> dict[str, float]:
    """µs per entry of each part of a verify: reading every row (best of three passes), then
    each entry's sha256, its HMAC and the JSON of effects' first entries, timed on the first
    ``SAMPLE`` rows held in memory (best of three); the rest is the median verify less those."""
    journal = open_journal(
        f"sqlite:///{path}", create=False, check_tail=False, signing_key=HMAC_KEY
    )
    check = HmacKey(bytes.fromhex(HMAC_KEY)).verifier()
    sha256 = hashlib.sha256

    def read() -> None:
        for batch in journal.iter_raw_batches():
            for _row in batch:
                pass

    try:
        sample = []
        for batch in journal.iter_raw_batches():
            for row in batch:
                sample.append(row)
                if len(sample) == SAMPLE:
                    break
            break
        per_read = _best(read) / entries
    finally:
        journal.close()
    digests = [(sha256(r[7]).digest(), r[6]) for r in sample]
    firsts = [r[7] for r in sample if not r[3]]
    n = len(sample)

    def hashed() -> None:
        for r in sample:
            sha256(r[7]).digest()

    def signed() -> None:
        for digest, sig in digests:
            check(digest, sig)

    def parsed() -> None:  # what the pass reads of them: the proposal's type and origin
        for body in firsts:
            first_facts(body)

    out = {
        "read": per_read,
        "sha256": _best(hashed) / n,
        "hmac": _best(signed) / n,
        "first entries' JSON": _best(parsed) / n,
    }
    out = {name: seconds * 1e6 for name, seconds in out.items()}
    out["the rest"] = max(verify_seconds / entries * 1e6 - sum(out.values()), 0.0)
    return out


def _best(step: Any) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return min(times)


def _ed25519_check_us(n: int = 2_000) -> float:
    key = Ed25519Key(bytes.fromhex(ED25519_SEED))
    digest = hashlib.sha256(b"bench").digest()
    sig = key.sign(digest)
    check = key.public_only().verifier()
    started = time.perf_counter()
    for _ in range(n):
        check(digest, sig)
    return (time.perf_counter() - started) / n * 1e6


def _time_cli(path: Path, *args: str, env: dict[str, str]) -> float:
    script = Path(sys.executable).with_name("interlock")
    started = time.perf_counter()
    done = subprocess.run(
        [str(script), "--journal", f"sqlite:///{path}", "journal", "verify", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"interlock journal verify failed: {done.stdout} {done.stderr}")
    return elapsed


def run(entries: int, ed25519_entries: int, repeats: int = 3) -> VerifyCost:
    print(
        f"5. journal verify: building {entries:,} entries (and {ed25519_entries:,} Ed25519) ...",
        flush=True,
    )
    directory = bench_dir("verify")
    started = time.perf_counter()
    hmac_path = directory / "hmac.db"
    per_entry = _build(hmac_path, HMAC_KEY, HmacKey(bytes.fromhex(HMAC_KEY)), entries)
    ed = Ed25519Key(bytes.fromhex(ED25519_SEED))
    ed_path = directory / "ed25519.db"
    _build(ed_path, f"ed25519:{ED25519_SEED}", ed, ed25519_entries)
    build = time.perf_counter() - started
    print(f"   built in {build:.0f} s; verifying ...", flush=True)
    jobs = sorted({1, 2, default_jobs()})
    cli_hmac = _time_cli(
        hmac_path, env={"PATH": "/usr/bin:/bin", "INTERLOCK_SIGNING_KEY": HMAC_KEY}
    )
    hmac_runs = _runs("HMAC-SHA256", hmac_path, repeats, jobs, cli_hmac, signing_key=HMAC_KEY)
    one = hmac_runs[0]
    print("   measuring what bounds it ...", flush=True)
    bounds = _bounds(hmac_path, sorted(one.seconds)[len(one.seconds) // 2], one.entries)
    cli_ed = _time_cli(ed_path, "--public-key", ed.public_text, env={"PATH": "/usr/bin:/bin"})
    ed_runs = _runs(
        "Ed25519 (public key only)",
        ed_path,
        repeats,
        [1, max(jobs)],
        cli_ed,
        public_keys=[ed.public_text],
    )
    return VerifyCost(
        runs=[*hmac_runs, *ed_runs],
        bytes_per_entry=per_entry,
        build_seconds=build,
        bounds=bounds,
        ed25519_check_us=_ed25519_check_us(),
    )
