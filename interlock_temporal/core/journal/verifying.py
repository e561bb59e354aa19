"""Verifying a whole journal: every entry in seq order, then the effects table against them.

``verify_stored`` reads the entries as the database returns them (tuples in ``RawEntry``'s
field order, a batch at a time) and checks the common entry on a short path: the next seq, the
next entry of a known effect (or the first of a new one), not an archive's tombstone or anchor
nor a ``VALUES_BOUND``; its bytes hash to its hash, its signature holds, the columns written
the canonical way are the bytes after its ``data``, and the values stored beside it are the
ones it signs. Anything else, and any entry that fails one of those checks, goes through the
full per-entry check (``ChainCheck.add``), which names what is wrong; so the short path only
ever accepts an entry the full check accepts, and updates its effect's chain exactly as the
full check would. The effects table is compared the same way: a row equal to what its entries
add up to passes; any other row is checked by ``ChainCheck.against``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from hmac import compare_digest
from itertools import islice
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, TypeVar

from ..models import ANNOTATIONS, EffectRow, JournalHead, Kind, VerifyReport
from .control_check import ChargeFold
from .entries import (
    ENDS,
    UNBOUND,
    VALS_STARTS,
    ChainCheck,
    ChainSummary,
    RawEntry,
    binds_values,
    check_entry,
    effect_row,
    origin_in,
    proposal_of,
    raw_entry,
    signed_ts,
)
from .signing import Ed25519Key, HmacKey, Keyring

T = TypeVar("T")

#: entries the short path leaves to the full check: they start a chain or add to its checks
_SPECIAL = frozenset({Kind.ARCHIVED.value, Kind.ANCHOR.value, Kind.VALUES_BOUND.value})
_ANNOTATIONS = frozenset(k.value for k in ANNOTATIONS)
#: the kinds the short path checks, as the signed bytes write them
_KINDS = {k.value: encode_basestring(k.value) for k in Kind if k.value not in _SPECIAL}
_STATUSES = frozenset(k.value for k in Kind)
_DISPATCHED = Kind.DISPATCHED.value
_ARCHIVED = Kind.ARCHIVED.value
#: what a partial pass compares an entry's prev with when it cannot take its effect up
_NO_CHAIN = ChainSummary(head="\x00")
#: how an entry without values beside it ends (format 2, 3 or 1)
_ENDS = (*ENDS, b',"v":1}')
_AT = b',"effect_id":'
_AT_LEN = len(_AT)
_DATA = b'{"data":'
#: the scanner ``json.loads`` reads a document with
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
#: a key's signature check, its id as the signed bytes write it, and an HMAC key's hashed pads
#: (``HmacKey.pads``: the check inlined) or None
_KeyCheck = tuple[Callable[[bytes, str], bool], str, Any, Any]
#: entries whose Ed25519 signatures are checked together, ahead of the pass, and on how many
#: threads (``EntryPass.prechecked``)
_PRECHECK = 512
_PRECHECK_THREADS = os.cpu_count() or 1
#: what a pass gives each entry it accepts of a kind in ``FED``: seq, effect id, kind, bytes
Feed = Callable[[int, str, str, bytes], None]
FED = ChargeFold.kinds


def archived_runs(anchors: Iterable[RawEntry]) -> tuple[dict[int, int], tuple[int, str] | None]:
    """The seqs the anchors say their archives took, as maximal runs (first seq -> last seq),
    and what is wrong with the anchors, if anything (at which seq)."""
    ranges: list[tuple[int, int, int]] = []
    for anchor in anchors:
        try:
            data = json.loads(anchor.body)["data"]
            ranges += [(int(a), int(b), anchor.seq) for a, b in data["ranges"]]
        except (ValueError, KeyError, TypeError):
            return {}, (anchor.seq, "an archive's anchor without its seq ranges")
    runs: dict[int, int] = {}
    start = end = -1
    for a, b, at in sorted(ranges):
        if a > b or a <= end:
            return {}, (at, "an archive's anchor names seqs another archive took, or none")
        if a == end + 1:
            end = b
            runs[start] = end
        else:
            start, end = a, b
            runs[start] = end
    return runs, None


def verify_entries(
    raws: Iterable[RawEntry],
    keyring: Keyring,
    head: JournalHead | None = None,
    rows: Iterable[EffectRow] | None = None,
    anchors: Sequence[RawEntry] = (),
) -> VerifyReport:
    """Check every entry in seq order; report the first bad one by seq. With ``rows`` (the
    effects table), also that each row says what its entries add up to. ``anchors``, the
    journal's archive anchors (read before): the seqs they name are the only ones that may be
    missing, and exactly those are."""
    batches = (
        ((r.seq, r.effect_id, r.kind, r.prev, r.hash, r.key_id, r.sig, r.body, r.vals),)
        for r in raws
    )
    values = None if rows is None else (_row_values(row) for row in rows)
    return verify_stored(batches, keyring, head, values, anchors)


def _row_values(row: EffectRow) -> tuple[Any, ...]:
    return (
        row.effect_id,
        row.effect_type,
        row.status.value,
        row.head,
        row.head_seq,
        row.updated_ts,
        row.first_dispatch_ts,
        row.last_dispatch_ts,
        row.origin,
    )


def verify_stored(
    batches: Iterable[Iterable[Sequence[Any]]],
    keyring: Keyring,
    head: JournalHead | None = None,
    rows: Iterable[Sequence[Any]] | None = None,
    anchors: Sequence[RawEntry] = (),
    *,
    short: bool = True,
    feed: Feed | None = None,
) -> VerifyReport:
    """``verify_entries`` of entries as stored: ``batches`` of tuples in ``RawEntry``'s field
    order, in seq order; ``rows``, the effects table's rows in ``EffectRow``'s field order.
    ``short=False`` checks every entry and row the full way (what the short path is tested
    against). ``feed`` is given every entry the pass accepts whose kind is in ``FED`` (the
    control plane's charges, ``control_check.ChargeFold``), in seq order. The cyclic garbage
    collector pauses meanwhile (``collector_paused``)."""
    with collector_paused():
        return _verify_stored(batches, keyring, head, rows, anchors, short, feed)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A pass allocates a row, a chain or a parsed first entry per entry and makes no cycles;
    with the collector running, its full collections walk every chain kept so far, again and
    again (measured: 18% of a pass over 200,000 entries, 34% over 1,000,000)."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


def _verify_stored(
    batches: Iterable[Iterable[Sequence[Any]]],
    keyring: Keyring,
    head: JournalHead | None,
    rows: Iterable[Sequence[Any]] | None,
    anchors: Sequence[RawEntry],
    short: bool,
    feed: Feed | None,
) -> VerifyReport:
    run = EntryPass(keyring, head, anchors, feed)
    if run.wrong is not None:
        return run.failed(*run.wrong)
    found, last = run.entries(batches) if short else run.full(batches)
    if found is not None:
        return run.failed(*found)
    final_head = None if last is None else JournalHead(seq=last[0], hash=last[4])
    if not run.head_seen:
        assert head is not None
        return run.failed(
            run.expected,
            f"the journal ends before the recorded head {head.seq} (tail cut)",
            final_head,
        )
    checker = run.checker
    unbound = checker.unbound() or anchors_hold(run.runs, run.covered, anchors, checker.anchors)
    if unbound is not None:
        return run.failed(*unbound, final_head)
    found = None if rows is None else rows_problem(checker, rows, short)
    if found is not None:
        return run.failed(*found, final_head)
    return VerifyReport(ok=True, entries=run.count, effects=len(checker.chains), head=final_head)


class EntryPass:
    """One pass over the entries: where the sequence is, and every effect's chain so far."""

    def __init__(
        self,
        keyring: Keyring,
        head: JournalHead | None,
        anchors: Sequence[RawEntry],
        feed: Feed | None = None,
        start: int = 1,
    ):
        self.keyring = keyring
        self.head = head
        self.feed = feed
        self.checker = ChainCheck(keyring)
        self.expected = start
        #: a pass over the entries from ``start`` on (> 1: ``verify_jobs``): an effect met
        #: first by an entry that continues its chain (prev set) is taken up there, its chain
        #: starting at that prev; here, per such effect, that entry's (seq, prev), which the
        #: passes before must end the effect's chain with
        self.partial = start > 1
        self.links: dict[str, tuple[int, str]] = {}
        self.count = 0
        self.head_seen = head is None
        self.runs, self.wrong = archived_runs(anchors)
        self.covered: set[int] = set()
        self.keys: dict[str, _KeyCheck | None] = {}
        #: per Ed25519 key: its check, and the (digest, signature) pairs of the entries at hand
        #: that it checked ahead and found good (``prechecked``)
        self.asymmetric: dict[str, tuple[Callable[[bytes, str], bool], set[tuple[bytes, str]]]]
        self.asymmetric = {}
        for key_id in keyring.key_ids:
            key = keyring.get(key_id)
            if isinstance(key, Ed25519Key):
                self.asymmetric[key_id] = (key.verifier(), set())

    def failed(self, seq: int, problem: str, final: JournalHead | None = None) -> VerifyReport:
        return VerifyReport(
            ok=False,
            entries=self.count,
            effects=len(self.checker.chains),
            head=final,
            first_bad_seq=seq,
            problem=problem,
        )

    def step(self, raw: RawEntry) -> tuple[int, str] | None:
        """The full check of the next entry: its place in the sequence, then in its chain."""
        found: tuple[int, str] | None = None
        expected = self.expected
        if raw.seq > expected and self.runs.get(expected) == raw.seq - 1:
            self.covered.add(expected)  # an archive took them: its anchor says so
        elif raw.seq != expected and check_entry(raw, self.keyring) in (None, UNBOUND):
            found = (
                raw.seq,
                (
                    f"entries {expected}..{raw.seq - 1} are missing"
                    if raw.seq > expected
                    else f"out of order (expected seq {expected})"
                ),
            )
        if found is None and self.partial and raw.effect_id not in self.checker.chains:
            self.continued(raw.effect_id, raw.seq, raw.prev, raw.kind)
        found = found or self.checker.add(raw)
        if found is not None:
            return found
        if self.feed is not None and raw.kind in FED:
            self.feed(raw.seq, raw.effect_id, raw.kind, raw.body)
        self.expected = raw.seq + 1
        self.count += 1
        if self.head is not None and raw.seq == self.head.seq:
            if raw.hash != self.head.hash:
                return raw.seq, "the recorded head does not match this entry"
            self.head_seen = True
        return None

    def continued(self, effect_id: str, seq: int, prev: str, kind: str) -> ChainSummary | None:
        """In a partial pass, the chain of an effect first met at ``seq`` by an entry that
        continues it (a tombstone starts a chain: not one), taken up at ``prev``."""
        if not prev or kind == _ARCHIVED:
            return None
        self.links[effect_id] = (seq, prev)
        chain = self.checker.chains[effect_id] = ChainSummary(
            head=prev, quoted_id=encode_basestring(effect_id)
        )
        return chain

    def key(self, key_id: str) -> _KeyCheck | None:
        if key_id not in self.keys:
            key = self.keyring.get(key_id)
            pads = key.pads() if isinstance(key, HmacKey) else (None, None)
            verify = None if key is None else key.verifier()
            if key_id in self.asymmetric:
                check, good = self.asymmetric[key_id]

                def verify(digest: bytes, sig: str) -> bool:
                    return (digest, sig) in good or check(digest, sig)

            self.keys[key_id] = (
                None if verify is None else (verify, encode_basestring(key_id), *pads)
            )
        return self.keys[key_id]

    def prechecked(
        self, batches: Iterable[Iterable[Sequence[Any]]]
    ) -> Generator[list[Any], None, None]:
        """The entries of ``batches`` in reads of ``_PRECHECK``, each yielded once its
        Ed25519 signatures were checked ahead on ``_PRECHECK_THREADS`` threads, which checked
        the next read's meanwhile: ``cryptography`` checks one signature per call (it has no
        batch verification) and lets other threads run during the check. A signature found
        good is not checked again; any other is checked again by the pass, which names it."""
        with ThreadPoolExecutor(_PRECHECK_THREADS, "interlock-verify") as pool:
            ahead: tuple[list[Any], list[Future[list[tuple[str, bytes, str]]]]] | None = None
            for batch in batches:
                rows = iter(batch)
                while chunk := list(islice(rows, _PRECHECK)):
                    step = -(-len(chunk) // _PRECHECK_THREADS)
                    parts = [chunk[at : at + step] for at in range(0, len(chunk), step)]
                    if ahead is not None:
                        yield self._checked(*ahead)
                    ahead = chunk, [pool.submit(self._good, part) for part in parts]
            if ahead is not None:
                yield self._checked(*ahead)

    def _checked(
        self, chunk: list[Any], checks: list[Future[list[tuple[str, bytes, str]]]]
    ) -> list[Any]:
        for _, good in self.asymmetric.values():
            good.clear()
        for done in checks:
            for key_id, digest, sig in done.result():
                self.asymmetric[key_id][1].add((digest, sig))
        return chunk

    def _good(self, rows: list[Any]) -> list[tuple[str, bytes, str]]:
        """The entries among ``rows`` whose Ed25519 signature holds (on a thread of its own:
        a row it cannot check is left to the pass)."""
        good = []
        sha256, keys = hashlib.sha256, self.asymmetric
        for values in rows:
            key_id, sig, body = values[5], values[6], values[7]
            key = keys.get(key_id)
            if key is None or type(body) is not bytes or type(sig) is not str:
                continue
            digest = sha256(body).digest()
            if key[0](digest, sig):
                good.append((key_id, digest, sig))
        return good

    def entries(
        self, batches: Iterable[Iterable[Sequence[Any]]]
    ) -> tuple[tuple[int, str] | None, Sequence[Any] | None]:
        """Check every entry: what is wrong first (at which seq), and the last entry read. The
        next entry of a known effect is checked here, the first of an effect by ``first``; any
        other, or one that fails a check, by ``step``. Ed25519 signatures are checked ahead
        (``prechecked``)."""
        if not self.asymmetric:
            return self._entries(batches)
        checked = self.prechecked(batches)
        try:
            return self._entries(checked)
        finally:
            checked.close()

    def _entries(
        self, batches: Iterable[Iterable[Sequence[Any]]]
    ) -> tuple[tuple[int, str] | None, Sequence[Any] | None]:
        chains, keys, first = self.checker.chains, self.keys, self.first
        head_seq = -1 if self.head is None else self.head.seq
        sha256, kinds, annotations, compare = hashlib.sha256, _KINDS, _ANNOTATIONS, compare_digest
        feed, fed, partial = self.feed, FED, self.partial
        last: Sequence[Any] | None = None
        expected, count = self.expected, self.count
        for batch in batches:
            for values in batch:
                last = values
                seq, eid, kind, prev, digest_hex, key_id, sig, body, vals = values
                chain = chains.get(eid)
                key = keys.get(key_id) or self.key(key_id)
                quoted_kind = kinds.get(kind)
                if not (
                    seq == expected
                    and seq != head_seq
                    and key is not None
                    and quoted_kind is not None
                    and type(body) is bytes
                ):
                    pass
                elif chain is None and (prev == "" or not partial):
                    if prev == "" and first(values, key, quoted_kind):
                        if feed is not None and kind in fed:
                            feed(seq, eid, kind, body)
                        expected, count = seq + 1, count + 1
                        continue
                elif prev == (chain or self.continued(eid, seq, prev, kind) or _NO_CHAIN).head:
                    chain = chains[eid]
                    digest = sha256(body).digest()
                    if digest.hex() != digest_hex:  # the hash first, as the full check
                        signed = False
                    elif key[2] is None:
                        signed = key[0](digest, sig)
                    else:  # HMAC, inlined
                        mac = key[2].copy()
                        mac.update(digest)
                        mac_out = key[3].copy()
                        mac_out.update(mac.digest())
                        signed = compare(mac_out.hexdigest(), sig)
                    # prev hashed to it: hex, written as it is
                    tail = (
                        f'{chain.quoted_id},"key_id":{key[1]},"kind":{quoted_kind},'
                        f'"prev":"{prev}","seq":{seq},"ts":'
                    ).encode()
                    at = body.rfind(_AT) + _AT_LEN
                    if (
                        signed
                        and at > _AT_LEN
                        and body.startswith(tail, at)
                        and body.startswith(_DATA)
                        and (body.endswith(_ENDS) if vals is None else _binds(body, vals))
                    ):
                        at += len(tail)
                        chain.head, chain.head_seq = digest_hex, seq
                        chain.head_body, chain.head_ts_at = body, at
                        if kind not in annotations:
                            chain.status = kind
                            if kind == _DISPATCHED:
                                ts = signed_ts(body, at)
                                if chain.first_dispatch is None:
                                    chain.first_dispatch = ts
                                chain.last_dispatch = ts
                        if feed is not None and kind in fed:
                            feed(seq, eid, kind, body)
                        expected, count = seq + 1, count + 1
                        continue
                # the full check names what is wrong, or accepts what the short path did not
                self.expected, self.count = expected, count
                found = self.step(raw_entry(values))
                if found is not None:
                    return found, last
                expected, count = self.expected, self.count
        self.expected, self.count = expected, count
        return None, last

    def full(
        self, batches: Iterable[Iterable[Sequence[Any]]]
    ) -> tuple[tuple[int, str] | None, Sequence[Any] | None]:
        """``entries`` with every entry checked the full way."""
        last: Sequence[Any] | None = None
        for batch in batches:
            for values in batch:
                last = values
                found = self.step(raw_entry(values))
                if found is not None:
                    return found, last
        return None, last

    def first(self, values: Sequence[Any], key: _KeyCheck, quoted_kind: str) -> bool:
        """Check the first entry of an effect and start its chain, as ``ChainCheck.add``
        does; False: leave it to the full check."""
        seq, eid, kind, _, digest_hex, _, sig, _, vals = values
        body: bytes = values[7]
        digest = hashlib.sha256(body).digest()
        quoted_id = encode_basestring(eid)
        tail = (
            f'{quoted_id},"key_id":{key[1]},"kind":{quoted_kind},"prev":"","seq":{seq},"ts":'
        ).encode()
        at = body.rfind(_AT) + _AT_LEN
        if not (
            digest.hex() == digest_hex
            and key[0](digest, sig)
            and at > _AT_LEN
            and body.startswith(tail, at)
            and body.startswith(_DATA)
            and _binds(body, vals)
        ):
            return False
        effect_type, origin = first_facts(body)
        at += len(tail)
        chain = self.checker.chains[eid] = ChainSummary(
            head=digest_hex, head_seq=seq, head_body=body, head_ts_at=at, quoted_id=quoted_id
        )
        chain.effect_type, chain.origin = effect_type, origin
        if kind not in _ANNOTATIONS:
            chain.status = kind
            if kind == _DISPATCHED:
                chain.first_dispatch = chain.last_dispatch = signed_ts(body, at)
        return True


def _binds(body: bytes, vals: Any) -> bool:
    """The signed bytes end as an entry's do that binds the values stored beside it (none:
    format 1, 2 or 3 without ``vals``; else their digest, format 2 or 3)."""
    if vals is None:
        return body.endswith(_ENDS)
    return type(vals) is str and binds_values(body, vals)


def first_facts(body: bytes) -> tuple[str | None, str | None]:
    """The effect type and the origin an effect's first entry (its signed bytes) signs in its
    proposal (``ChainCheck.add``, ``proposal_of``). Its bytes start with ``{``, so
    ``json.loads`` reads them as UTF-8 and scans one value from the start: scanned here with
    the same scanner, without its wrappers; ``json.loads`` itself when anything else follows
    the value (or none is there), to fail as it fails. A combined dispatch's proposal alone,
    where it can be told to be its data's last value (``_proposal``): the other parts are
    twice its bytes."""
    data: Mapping[str, Any] | None = _proposal(body)
    if data is None:
        text = body.decode("utf-8", "surrogatepass")
        try:
            doc, end = _scan_once(text, 0)
        except StopIteration:
            doc, end = None, -1
        if end != len(text):
            doc = json.loads(body)
        data = proposal_of(doc)
    effect_type = data.get("effect_type")
    return (effect_type if isinstance(effect_type, str) else None), origin_in(data)


#: a combined dispatch's proposal, the last of its data's keys in canonical order
_PROPOSAL = b',"proposal":{'
#: how the signed bytes of a combined dispatch end: its format, then the digest of its values
_COMBINED_END, _COMBINED_VALS = ENDS[1], VALS_STARTS[1]
_COMBINED_VALS_END = len(_COMBINED_VALS) + 64 + 2


def _proposal(body: bytes) -> dict[str, Any] | None:
    """The proposal of a combined dispatch's signed bytes, scanned alone, or None: not a
    combined dispatch by its last fields (``"v":3``, and the values' digest after it), or its
    proposal not found to be the last value of the entry's data (read the whole document
    then). The last ``,"proposal":{`` before the envelope's fields is the data's own key when
    the object after it ends where the data does, one ``}`` before them: inside a string its
    quotes would be escaped, and a key inside the proposal would be followed by the proposal's
    ``}`` too."""
    if not (
        body.endswith(_COMBINED_END)
        or (body[-_COMBINED_VALS_END:].startswith(_COMBINED_VALS) and body.endswith(b'"}'))
    ):
        return None
    at = body.rfind(_AT)
    start = body.rfind(_PROPOSAL, 0, at) + len(_PROPOSAL) - 1
    if at < 0 or start < len(_PROPOSAL) or body[at - 1 : at] != b"}":
        return None
    text = body[start : at - 1].decode("utf-8", "surrogatepass")
    try:
        doc, end = _scan_once(text, 0)
    except StopIteration:
        return None
    return doc if end == len(text) and type(doc) is dict else None


def rows_problem(
    checker: ChainCheck, rows: Iterable[Sequence[Any]], short: bool = True
) -> tuple[int, str] | None:
    """The first row of the effects table (by seq) that its entries do not add up to: a row
    equal to its chain's sums passes, any other is checked by ``ChainCheck.against``."""
    chains = checker.chains
    problems = []
    listed = set()
    for values in rows:
        eid = values[0]
        listed.add(eid)
        chain = chains.get(eid)
        if short and chain is not None and row_matches(values, chain):
            continue
        try:
            row = effect_row(values)
        except ValueError:  # a value its column cannot hold (SQLite keeps what it is given)
            seq = 0 if chain is None else chain.head_seq
            problems.append((seq, f"the effects table's row of {str(eid)[:16]} does not parse"))
            continue
        found = checker.against(eid, row)
        if found is not None:
            problems.append(found)
    problems += [
        found for eid in chains.keys() - listed if (found := checker.against(eid, None)) is not None
    ]
    return min(problems) if problems else None


def row_matches(values: Sequence[Any], chain: ChainSummary) -> bool:
    """The effects row ``values`` says exactly what ``chain`` adds up to (the common case,
    compared without building the row; anything else goes to ``ChainCheck.against``)."""
    _, effect_type, status, head, head_seq, updated, first, last, origin = values
    return (
        head == chain.head
        and head_seq == chain.head_seq
        and status == chain.status
        and status in _STATUSES
        and type(effect_type) is str
        and (chain.effect_type is None or effect_type == chain.effect_type)
        and origin == chain.origin
        and first == chain.first_dispatch
        and last == chain.last_dispatch
        and updated is not None
        and updated == chain.updated
    )


def anchors_hold(
    runs: Mapping[int, int],
    covered: set[int],
    given: Sequence[RawEntry],
    seen: Sequence[RawEntry],
) -> tuple[int, str] | None:
    """What is wrong once every entry was read: an anchor read before that the pass did not
    meet, or seqs an anchor names that are live."""
    met = {a.hash for a in seen}
    for anchor in given:
        if anchor.hash not in met:
            return anchor.seq, "an archive's anchor read before verifying is not in the journal"
    for start in sorted(runs.keys() - covered):
        return start, f"entries {start}..{runs[start]} an archive's anchor names are live"
    return None


def read_ahead(batches: Callable[[], Iterator[T]], depth: int = 2) -> Iterator[T]:
    """What ``batches()`` yields, read by a thread of its own while the caller checks what it
    read before: a database server produces the next batch meanwhile, instead of after (on
    PostgreSQL it took 1.5 s of a 3.3 s verify of 200,000 entries). Its errors are raised
    here; closing this iterator stops the thread, which closes ``batches()``."""
    ready: queue.Queue[tuple[bool, Any]] = queue.Queue(depth)
    stop = threading.Event()

    def read() -> None:
        source = batches()
        try:
            for batch in source:
                while not stop.is_set():
                    try:
                        ready.put((True, batch), timeout=0.05)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put((False, None))
        except BaseException as err:  # raised to the reader, in its thread
            ready.put((False, err))
        finally:
            source_close = getattr(source, "close", None)
            if source_close is not None:
                source_close()

    thread = threading.Thread(target=read, name="interlock-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            more, item = ready.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                ready.get_nowait()
        thread.join()
