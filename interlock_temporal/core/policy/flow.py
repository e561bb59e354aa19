"""Flow provenance: where did the text in a call's arguments come from?

The problem: a model that reads a web page or an inbox can be told, by the text it read, to
copy that text (or a secret beside it) into an email, a refund destination, a commit. A rule
that sees only the call cannot tell fetched text from text the agent wrote. So the result of
every policed or gated activity is remembered as **marks**: keyed fingerprints of its
distinctive fragments, each with its origin labels (``activity:<name>``, ``principal:<id>``),
kept in the policy store under the call's scope (its session, or its workflow run: the
policy's ``flow_scope``). Before a later call runs, its argument strings are fingerprinted the
same way and looked up; the labels found reach the rules as ``CallEvent.origins`` (argument
path -> labels), which the declarative ``flow`` condition and ``flow_matches`` read.

The mechanism (pure: no I/O, no Temporal):

- ``normalized``: NFKC, case folded, every run of whitespace one space. A model that reflows
  or re-cases copied text keeps its origin; any other rewrite (a translation, a summary, a
  character swapped every few letters) loses it.
- recording (``fragments``): every string of the result (at most ``MAX_INSPECTED`` characters
  of them per call, in order) of at least ``MIN_CHARS`` characters once normalized gives its
  windows of ``MIN_CHARS`` characters at every ``stride``-th position (and its last window),
  where ``stride`` is ``MIN_CHARS`` or more, chosen so that a call gives at most
  ``MAX_PER_CALL`` fragments. A copy of any ``stride + MIN_CHARS - 1`` consecutive characters
  holds one whole aligned window: a result of up to 8 KiB is found from any 31 characters
  copied, one of 64 KiB from any 143; a whole string of 16 or more is always found.
- lookup (``candidates``): every window of ``MIN_CHARS`` characters, at every position, of each
  argument string (at most ``MAX_INSPECTED`` characters per call), so text copied anywhere
  inside a longer argument is found. The store is asked once for the marks among them.
- ``fingerprint``: keyed BLAKE2b, 16 bytes, under a key derived from the journal's keyring: the
  store never holds the text, and whoever reads it cannot test a guess without the key.

Cost: one keyed BLAKE2b (about 1 us) per fragment recorded (512 at most per call) and per
character of argument text looked up (a 2 KB email body: 2,000 hashes, about 2 ms; 64 KiB at
most: about 70 ms), and one indexed query each way. Nothing at all while the policy has no
flow rule.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..identity import UnserializableInput, jsonable
from .call import CallEvent

#: the shortest fragment remembered, in normalized characters: shorter text is not distinctive
MIN_CHARS = 16
#: the most characters of strings inspected per call, when recording and when looking up
MAX_INSPECTED = 64 * 1024
#: the most fragments recorded per call
MAX_PER_CALL = 512
#: the most marks (fragment x label) kept per scope: the oldest are evicted beyond it
MAX_PER_SCOPE = 8192
#: the bytes of a fingerprint
FP_BYTES = 16
_DOMAIN = b"interlock-flow/1\x00"
_SPACE = re.compile(r"\s+")


def normalized(text: str) -> str:
    """``text`` as fragments are cut from it: NFKC, case folded, whitespace runs as one space."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def _step(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, _step(path, str(key)))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(item, _step(path, i))


def argument_strings(event: CallEvent) -> Iterator[tuple[str, str]]:
    """Every string of the call's arguments with its path, as a rule names it: a single
    argument's fields at the top (``body``, ``payload.body``, ``items[0]``), else each
    argument by its parameter name (``args[i]`` where names are unknown). Values with no JSON
    form give nothing (Temporal could not have carried them)."""
    try:
        data = jsonable(list(event.args))
    except UnserializableInput:
        return
    if len(data) == 1 and isinstance(data[0], Mapping):
        yield from _walk(data[0], "")
        return
    names = event.param_names if len(event.param_names) == len(data) else ()
    for i, value in enumerate(data):
        yield from _walk(value, names[i] if names else f"args[{i}]")


def result_strings(result: Any) -> Iterator[str]:
    """Every string of an activity's result (its JSON form)."""
    try:
        data = jsonable(result)
    except UnserializableInput:
        return
    for _, text in _walk(data, ""):
        yield text


def _inspected(texts: Iterable[str]) -> list[str]:
    """The normalized texts, cut to ``MAX_INSPECTED`` characters in all."""
    out, budget = [], MAX_INSPECTED
    for text in texts:
        if budget <= 0:
            break
        cut = normalized(text[: budget * 2])[:budget]  # normalizing may shrink, never 2x grow
        budget -= len(cut)
        out.append(cut)
    return out


def fragments(result: Any) -> list[str]:
    """The fragments of ``result`` to remember (see the module's doc): aligned windows of
    ``MIN_CHARS`` normalized characters, at most ``MAX_PER_CALL``, without repeats."""
    texts = [t for t in _inspected(result_strings(result)) if len(t) >= MIN_CHARS]
    total = sum(len(t) - MIN_CHARS + 1 for t in texts)
    stride = max(MIN_CHARS, math.ceil(total / MAX_PER_CALL))
    found: dict[str, None] = {}
    for text in texts:
        last = len(text) - MIN_CHARS
        for start in [*range(0, last + 1, stride), last]:
            found[text[start : start + MIN_CHARS]] = None
    return list(found)[:MAX_PER_CALL]


def fingerprint(key: bytes, fragment: str) -> str:
    """The keyed fingerprint of a normalized fragment, as hex (``FP_BYTES`` bytes)."""
    h = hashlib.blake2b(_DOMAIN + fragment.encode(), key=key, digest_size=FP_BYTES)
    return h.hexdigest()


def candidates(key: bytes, event: CallEvent) -> dict[str, frozenset[str]]:
    """Fingerprint -> the argument paths holding it: every window of ``MIN_CHARS`` normalized
    characters of each argument string (``MAX_INSPECTED`` characters per call at most)."""
    paths: list[str] = []
    texts: list[str] = []
    for path, text in argument_strings(event):
        paths.append(path)
        texts.append(text)
    out: dict[str, set[str]] = {}
    seen: dict[str, str] = {}
    for path, text in zip(paths, _inspected(texts), strict=False):
        for start in range(len(text) - MIN_CHARS + 1):
            window = text[start : start + MIN_CHARS]
            fp = seen.get(window)
            if fp is None:
                fp = seen[window] = fingerprint(key, window)
            out.setdefault(fp, set()).add(path)
    return {fp: frozenset(p) for fp, p in out.items()}


def origins_for(
    found: Mapping[str, Iterable[str]], marks: Mapping[str, Iterable[str]]
) -> dict[str, tuple[str, ...]]:
    """Argument path -> the labels of the marks its text carries: ``found`` is ``candidates``,
    ``marks`` the store's fingerprint -> labels among them."""
    out: dict[str, set[str]] = {}
    for fp, labels in marks.items():
        for path in found.get(fp, ()):
            out.setdefault(path, set()).update(labels)
    return {path: tuple(sorted(labels)) for path, labels in sorted(out.items())}


def labels_of(activity: str, principal: str | None) -> tuple[str, ...]:
    """The origin labels of a result: ``activity:<name>``, and ``principal:<id>`` when known."""
    return (f"activity:{activity}", *([f"principal:{principal}"] if principal else []))


def _globs(selector: str | Iterable[str]) -> tuple[str, ...]:
    return (selector,) if isinstance(selector, str) else tuple(selector)


def _segments(path: str) -> list[str]:
    """The starts and ends of ``path`` at its segments: ``payload.items[0].body`` gives the
    tails ``items[0].body``, ``[0].body``, ``body`` and the heads ``payload``,
    ``payload.items``, ``payload.items[0]``."""
    cuts = [m.start() for m in re.finditer(r"[.\[]", path)]
    tails = [path[c + 1 :] if path[c] == "." else path[c:] for c in cuts]
    heads = [path[:c] for c in cuts if c]
    return [path, *tails, *heads]


def sink_matches(path: str, sink: str) -> bool:
    """Whether argument ``path`` is under ``sink`` (a glob): the whole path, a tail of it (a
    top-level ``body`` matches ``payload.body``) or a head of it (``body`` matches
    ``body.html``), each cut at a segment."""
    return any(fnmatch.fnmatchcase(part, sink) for part in _segments(path))


def flow_matches(
    event: CallEvent, sources: str | Iterable[str], sinks: str | Iterable[str]
) -> tuple[str, str] | None:
    """(argument path, label) of the first origin on ``event.origins`` whose label matches one
    of ``sources`` and whose path is under one of ``sinks`` (``sink_matches``); else None.
    Both take a glob or a list of them. The declarative ``flow`` condition is this."""
    source_globs, sink_globs = _globs(sources), _globs(sinks)
    for path, labels in sorted(event.origins.items()):
        if not any(sink_matches(path, s) for s in sink_globs):
            continue
        for label in labels:
            if any(fnmatch.fnmatchcase(label, s) for s in source_globs):
                return path, label
    return None
