"""Effect identity: derived from the approved request, never from a delivery.

``effect_id = sha256(JCS({"effect_type": ..., "key": ...}))`` where JCS is RFC 8785 canonical
JSON, so any language can recompute an id from the same decision. The key is spelled so that
values of one meaning name one effect (``equal_meaning``): a Decimal as its canonical text
(``decimal_text``: ``30.00`` and ``30.0`` are ``30``), every string in Unicode NFC. No version
is hashed: a key with no Decimal and no string that NFC changes has the id it always had.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import hashlib
import json
import math
import pathlib
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import rfc8785
from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic_core import to_jsonable_python


class UnserializableInput(TypeError):
    """A value that has no canonical JSON form (so it cannot name or digest an effect)."""


#: how deep JSON data may nest: containers (lists, mappings, models, dataclasses, sets) on one
#: path from the top. pydantic's serializer stops a little deeper (it writes 255 nested lists,
#: not 255 nested models); a deeper value, or one that contains itself, is refused naming where
DEPTH_LIMIT = 254
#: a message shows this many steps of a long path at each end, and counts the steps between
PATH_ENDS = 6
#: the longest a mapping key may be as a step of a path in a message (longer ones are cut)
KEY_CHARS = 40

#: a place in a value, for messages: None for the top, else ``(parent, step)``; rendered only
#: when a message needs it (``path_text``), so a walk does not build a string per node
Where = tuple[Any, str] | None


def key_step(key: object) -> str:
    """A mapping key as a step of a path: ``['order']``, cut to ``KEY_CHARS``."""
    text = repr(key)
    if len(text) > KEY_CHARS:
        text = text[: KEY_CHARS - 1] + "\u2026"
    return f"[{text}]"


def path_text(root: str, where: Where) -> str:
    """The path of ``where`` under ``root``, as Python indexes it (``r['lines'][1].sku``),
    bounded: a path of more than ``2 * PATH_ENDS`` steps shows its ends and counts the steps
    between (``r[0][0]…(19,988 more levels)…[0][0]``), so a message about a deep value stays
    short. A step into a set makes the path ``an item of <path to the set>`` and what follows."""
    steps: list[str] = []
    while where is not None:
        where, step = where
        steps.append(step)
    steps.reverse()
    if SET_ITEM in steps:
        at = steps.index(SET_ITEM)
        return "an item of " + _joined(root, steps[:at]) + _joined("", steps[at + 1 :])
    return _joined(root, steps)


#: the step into a set's item (it has no index)
SET_ITEM = "{item}"


def _joined(root: str, steps: Sequence[str]) -> str:
    """``root`` and ``steps`` as one path, its middle counted when it is long."""
    if len(steps) <= 2 * PATH_ENDS:
        return root + "".join(steps)
    hidden = len(steps) - 2 * PATH_ENDS
    head, tail = "".join(steps[:PATH_ENDS]), "".join(steps[-PATH_ENDS:])
    return f"{root}{head}\u2026({hidden:,} more levels)\u2026{tail}"


def dotted_path(root: str, parts: Sequence[object]) -> str:
    """``root.a.0.b``: a path as pydantic's error locations name it, each part cut to
    ``KEY_CHARS`` and the middle of a long one counted (as ``path_text`` does)."""
    steps = []
    for part in parts:
        text = str(part)
        if len(text) > KEY_CHARS:
            text = text[: KEY_CHARS - 1] + "\u2026"
        steps.append(f".{text}")
    return _joined(root, steps)


def too_deep(root: str, where: Where) -> str:
    """The refusal of a value nested deeper than ``DEPTH_LIMIT`` (or containing itself)."""
    return (
        f"{path_text(root, where)} is nested more than {DEPTH_LIMIT} levels deep "
        "(or contains itself)"
    )


def jsonable(value: Any, path: str | None = None) -> Any:
    """The JSON data model of ``value`` (pydantic models, dataclasses, datetimes included).

    A ``SecretStr`` becomes its mask, so secrets never reach a digest input or the journal.
    What is not JSON data is refused naming where it is, from ``path`` (the name ``value`` has
    for the reader, e.g. ``key``) down, and its type: ``key['order']['when']: Clock is not
    JSON data``. Never the value. A value nested deeper than ``DEPTH_LIMIT`` (or containing
    itself) is refused as such, its path cut in the middle: the message stays short.
    """
    try:
        return to_jsonable_python(value)
    except Exception as err:  # pydantic raises PydanticSerializationError
        root = path or "value"
        deep = _deeper_than_the_limit(value)
        if deep is not None:
            raise UnserializableInput(too_deep(root, deep)) from None
        where, culprit = _not_json_part(value)
        if path is None and culprit is value:
            raise UnserializableInput(
                f"value of type {type(culprit).__name__} is not JSON data"
            ) from err
        raise UnserializableInput(
            f"{path_text(root, where)}: {type(culprit).__name__} is not JSON data"
        ) from err


def item_path(where: str, key: object) -> str:
    """The path of an entry of a mapping, as Python indexes it: ``key['order']``."""
    return f"{where}{key_step(key)}"


def _parts(x: Any, where: Where) -> list[tuple[Any, Where]]:
    """The values ``x`` holds, each with its place (none for a leaf)."""
    if isinstance(x, BaseModel):
        named = [(getattr(x, name), (where, f".{name}")) for name in type(x).model_fields]
        return named + [(v, (where, f".{k}")) for k, v in (x.model_extra or {}).items()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(getattr(x, f.name), (where, f".{f.name}")) for f in dataclasses.fields(x)]
    if isinstance(x, Mapping):
        return [(v, (where, key_step(k))) for k, v in x.items()]
    if isinstance(x, list | tuple):
        return [(v, (where, f"[{i}]")) for i, v in enumerate(x)]
    if isinstance(x, set | frozenset):
        return [(v, (where, SET_ITEM)) for v in x]
    return []


def _deeper_than_the_limit(value: Any) -> Where | None:
    """The place of a container nested deeper than ``DEPTH_LIMIT`` in ``value`` (None: there
    is none). Depth first, without recursion, and never past the limit: a value that contains
    itself ends there too."""
    stack: list[tuple[Any, Where, int]] = [(value, None, 1)]
    while stack:
        x, where, depth = stack.pop()
        parts = _parts(x, where)
        if not parts and not _is_container(x):
            continue
        if depth > DEPTH_LIMIT:
            return where
        stack.extend((part, at, depth + 1) for part, at in parts)
    return None


def _is_container(x: Any) -> bool:
    return isinstance(x, BaseModel | Mapping | list | tuple | set | frozenset) or (
        dataclasses.is_dataclass(x) and not isinstance(x, type)
    )


def _serializes(x: Any) -> bool:
    try:
        to_jsonable_python(x)
    except Exception:
        return False
    return True


def _not_json_part(value: Any) -> tuple[Where, Any]:
    """(place, value) of the innermost part of ``value`` that does not serialize: a part whose
    own parts all do (an unknown object, or a container pydantic cannot write). ``value`` is
    no deeper than ``DEPTH_LIMIT``, so the descent ends."""
    where: Where = None
    while True:
        for part, at in _parts(value, where):
            if not _serializes(part):
                value, where = part, at
                break
        else:
            return where, value


_SAFE_INT = 2**53 - 1

#: values whose JSON form is one and the same in every process (pydantic writes them as strings)
_STABLE_LEAVES = (
    bool,
    str,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    pathlib.PurePath,
    SecretStr,
    SecretBytes,
)


def unstable_part(value: Any, path: str, *, allow_bytes: bool = False) -> str | None:
    """Where ``value`` (a key, or an input, as the activity holds it) has no single canonical
    JSON form, as ``"<path> is a <type>..."``; None when it has one everywhere.

    ``jsonable`` would turn a set into a list in hash order (which differs between processes),
    bytes into text, an unknown object into whatever its serializer says: the effect id would
    change between attempts. Names the path and the type, never the value; the path is cut in
    the middle when it is long (``path_text``). A value nested deeper than ``DEPTH_LIMIT``, or
    that contains itself, is refused too (the walk stops there). ``allow_bytes``: an input
    that is not the key may carry bytes (an attachment): they digest the same everywhere, but
    a key names a decision in JSON any language can recompute."""
    if _plainly_stable(value):
        return None
    stack: list[tuple[Any, Where, int]] = [(value, None, 0)]
    while stack:
        x, where, depth = stack.pop()
        if x is None or isinstance(x, _STABLE_LEAVES):
            continue
        if isinstance(x, int):
            if not -_SAFE_INT <= x <= _SAFE_INT:
                at = path_text(path, where)
                return f"{at} is an integer outside the interoperable JSON range (2**53)"
            continue
        if isinstance(x, float | decimal.Decimal):
            problem = _number_problem(x)
            if problem is not None:
                return f"{path_text(path, where)} is a {type(x).__name__} {problem}"
            continue
        if isinstance(x, enum.Enum):
            stack.append((x.value, where, depth))
            continue
        if depth >= DEPTH_LIMIT and _is_container(x):
            return too_deep(path, where)
        depth += 1
        if isinstance(x, BaseModel):
            fields = type(x).model_fields
            stack.extend((getattr(x, name), (where, f".{name}"), depth) for name in fields)
            extra = (x.model_extra or {}).items()
            stack.extend((v, (where, f".{k}"), depth) for k, v in extra)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(
                (getattr(x, f.name), (where, f".{f.name}"), depth) for f in dataclasses.fields(x)
            )
        elif isinstance(x, Mapping):
            for k, v in x.items():
                if not isinstance(k, str):
                    at = path_text(path, where)
                    return f"{at} has a key of type {type(k).__name__}, not a string"
                stack.append((v, (where, key_step(k)), depth))
        elif isinstance(x, list | tuple):
            stack.extend((v, (where, f"[{i}]"), depth) for i, v in enumerate(x))
        elif isinstance(x, set | frozenset):
            return (
                f"{path_text(path, where)} is a {type(x).__name__}, which has no order: its "
                "JSON changes between processes (use a sorted list)"
            )
        elif isinstance(x, bytes | bytearray | memoryview):
            if not allow_bytes:
                at = path_text(path, where)
                return f"{at} is {type(x).__name__}, which has no canonical JSON form"
        else:
            return f"{path_text(path, where)}: {type(x).__name__} is not JSON data"
    return None


def _number_problem(x: float | decimal.Decimal) -> str | None:
    """Why a float or Decimal has no canonical form (None: it has one). A Decimal is judged
    as itself, not as the float it would round to (``Decimal("1E+400")`` is finite)."""
    if isinstance(x, decimal.Decimal):
        if not x.is_finite():
            return "that is NaN or infinite"
        if _decimal_chars(x) > DECIMAL_CHARS:
            return f"longer than {DECIMAL_CHARS:,} characters written without an exponent"
        return None
    return None if math.isfinite(x) else "that is NaN or infinite"


def _plainly_stable(data: Any) -> bool:
    """The fast answer for the common case: plain JSON data (and models of it) with no value
    ``unstable_part`` refuses, nested no deeper than ``DEPTH_LIMIT``. False sends the value
    through ``unstable_part``'s full walk, which also builds the path it names. Level by level,
    so a value that contains itself ends at the limit."""
    level = [data]
    depth = 0  # how many containers are above the values of ``level``
    while level:
        below: list[Any] = []
        for x in level:
            t = type(x)
            if t is str or t is bool or x is None:
                continue
            if t is int:
                if not -_SAFE_INT <= x <= _SAFE_INT:
                    return False
            elif t is float:
                if not math.isfinite(x):
                    return False
            elif t is dict:
                if depth >= DEPTH_LIMIT:
                    return False
                for k, v in x.items():
                    if type(k) is not str:
                        return False
                    below.append(v)
            elif t is list or t is tuple:
                if depth >= DEPTH_LIMIT:
                    return False
                below.extend(x)
            elif isinstance(x, BaseModel):
                if depth >= DEPTH_LIMIT:
                    return False
                below.extend(getattr(x, name) for name in type(x).model_fields)
                if x.model_extra:  # a level lower than it is: the answer may only be False
                    below.append(x.model_extra)
            elif not isinstance(x, _STABLE_LEAVES):
                return False
        depth += 1
        level = below
    return True


def _json_module_is_canonical(data: Any) -> bool:
    """Whether ``json.dumps(sort_keys=True)`` already writes the RFC 8785 bytes of ``data``.

    It does when every string is ASCII (so sorting by code point is sorting by UTF-16 unit, and
    there is no lone surrogate), every integer is in the interoperable range, and every float
    is written the same way by Python's ``repr`` and ECMAScript's ``Number.toString``: finite,
    not integral, and between 1e-4 and 1e16 in magnitude (both then print plain shortest
    round-trip digits). Anything else goes through the reference implementation.
    """
    t = type(data)
    if t is not dict and t is not list:
        return _canonical_leaf(data, t)
    # containers on the stack; their leaves (most of the nodes) are checked where they stand
    stack = [data]
    while stack:
        x = stack.pop()
        if type(x) is dict:
            for k in x:
                if type(k) is not str or not k.isascii():
                    return False
            items = x.values()
        else:
            items = x
        for v in items:
            t = type(v)
            if t is str:
                if not v.isascii():
                    return False
            elif t is dict or t is list:
                stack.append(v)
            elif not _canonical_leaf(v, t):
                return False
    return True


def _canonical_leaf(x: Any, t: type) -> bool:
    """``_json_module_is_canonical`` for a value that is not a container."""
    if t is str:
        return bool(x.isascii())
    if t is int:
        return bool(-_SAFE_INT <= x <= _SAFE_INT)
    if t is float:
        return bool(1e-4 <= abs(x) < 1e16 and not x.is_integer())
    return t is bool or x is None


def _sorted_compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, with
    the C encoder made once instead of on every call (a third of the call's time for an
    entry-sized document). Only for data ``_json_module_is_canonical`` has walked, so the
    encoder's cycle check is not needed."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return functools.partial(
            json.dumps, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    encode = c_make_encoder(None, None, encode_basestring, None, ":", ",", True, False, True)
    return lambda data: "".join(encode(data, 0))


_dumps_sorted = _sorted_compact_encoder()


def canonical_json(data: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of ``data``, which must already be JSON data."""
    if _json_module_is_canonical(data):
        return _dumps_sorted(data).encode()
    try:
        return rfc8785.dumps(data)
    except rfc8785.IntegerDomainError:
        raise UnserializableInput(
            "an integer outside the interoperable JSON range (2**53)"
        ) from None
    except rfc8785.FloatDomainError:
        raise UnserializableInput("a float that is NaN or infinite") from None
    except rfc8785.CanonicalizationError as err:
        # the library's message can quote the value; never echo argument values
        if isinstance(err.__cause__, UnicodeError):
            raise UnserializableInput(
                "a string that is not valid Unicode (a lone surrogate)"
            ) from None
        raise UnserializableInput("a value with no canonical JSON form") from None
    except UnicodeError:  # a lone surrogate in a key: met while sorting the keys
        raise UnserializableInput("a string that is not valid Unicode (a lone surrogate)") from None


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of ``value`` (models, dataclasses, datetimes included)."""
    return canonical_json(jsonable(value))


def digest(value: Any) -> str:
    """Hex sha256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()


#: the longest text a Decimal may have in an effect's identity (``decimal_text``): written
#: without an exponent, ``Decimal("1E+999999")`` would be a million characters
DECIMAL_CHARS = 1_000


def _stripped(d: decimal.Decimal) -> tuple[int, str, int]:
    """(sign, significant digits, exponent) of a finite non-zero Decimal, trailing zeros of
    its coefficient moved into the exponent."""
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    kept = text.rstrip("0")
    return sign, kept, exponent + len(text) - len(kept)


def _decimal_chars(d: decimal.Decimal) -> int:
    """How long ``decimal_text(d)`` is, without writing it."""
    if not d.is_finite() or d.is_zero():
        return 1
    sign, digits, exponent = _stripped(d)
    if exponent >= 0:
        return sign + len(digits) + exponent
    return sign + max(len(digits), -exponent + 1) + 1


def decimal_text(d: decimal.Decimal) -> str:
    """A Decimal's canonical text, as an effect's identity writes it: no exponent, no trailing
    zeros after the point, no point when nothing follows it, and every zero as ``0``:
    ``Decimal("30.00")``, ``Decimal("30.0")`` and ``Decimal("3E+1")`` are all ``30``,
    ``Decimal("1.50")`` is ``1.5``, ``Decimal("-0.00")`` is ``0``. Exact: no context, no
    rounding. Refuses (``UnserializableInput``) NaN, infinities and a text longer than
    ``DECIMAL_CHARS``, naming no value."""
    problem = _number_problem(d)
    if problem is not None:
        raise UnserializableInput(f"a Decimal {problem}")
    if d.is_zero():
        return "0"
    sign, digits, exponent = _stripped(d)
    if exponent >= 0:
        text = digits + "0" * exponent
    elif len(digits) > -exponent:
        text = f"{digits[:exponent]}.{digits[exponent:]}"
    else:
        text = "0." + digits.rjust(-exponent, "0")
    return "-" + text if sign else text


def equal_meaning(value: Any, data: Any, path: str = "value") -> Any:
    """``data``, the JSON data of ``value`` (``jsonable(value)``), spelled as an effect's
    identity spells it, so that values of one meaning name one effect: a Decimal of ``value``
    that pydantic wrote as its text (``str(d)``, which keeps trailing zeros and exponents) as
    its canonical text (``decimal_text``), and every string, mapping keys too, in Unicode NFC.

    A Decimal stays a JSON string: ``Decimal("30.00")``, ``Decimal("30")`` and the string
    ``"30"`` are spelled alike; the number ``30`` (an int, or the float ``30.0``) is not. A
    Decimal is found where ``value`` holds it beside its text in ``data``: in a mapping, a
    list or tuple, a model's field (by name or serialization alias, or an extra) or a
    dataclass's; a field whose serializer writes something else is left as written.

    Returns ``data`` itself when nothing changes (no Decimal, every string already NFC: the
    common case), so a caller can tell whether the spelling before this one differs. Refuses
    (``UnserializableInput``) a mapping with two keys that are one string in NFC, naming where.
    ``data`` is no deeper than ``DEPTH_LIMIT`` (``jsonable`` made it), so the recursion ends.
    Costs a scan of ``data`` for a string that is not ASCII or reads as a number, and a walk
    beside ``value`` only when it finds one."""
    if not _may_respell(data):
        return data
    return _spelled(value, data, path, None)


#: what ``str`` writes for a finite Decimal (pydantic writes a Decimal so), and how it starts
_DECIMAL_STR = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:E[+-][0-9]+)?")
_DECIMAL_START = frozenset("-.0123456789")


#: a JSON string token whose text reads as a Decimal's (``_DECIMAL_STR`` between quotes)
_DECIMAL_TOKEN = re.compile(rb'"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:E[+-][0-9]+)?"')


def may_respell(canonical: bytes) -> bool:
    """Whether ``equal_meaning`` might change the data ``canonical`` (its ``canonical_json``)
    writes: it holds a byte that is not ASCII (NFC may change a string), or a string token that
    reads as a Decimal's text. Never False where ``equal_meaning`` would change something (a
    Decimal's text is written between quotes with nothing to escape), and a false True only
    costs ``equal_meaning``'s own walk. Two scans in C over bytes the caller has already made,
    where ``equal_meaning``'s own check walks the data in Python (a few microseconds more per
    input)."""
    return not canonical.isascii() or _DECIMAL_TOKEN.search(canonical) is not None


def _may_respell(data: Any) -> bool:
    """Whether ``data`` holds a string ``equal_meaning`` might change: one that is not ASCII
    (NFC may change it) or that reads as a Decimal's text."""
    stack = [data]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is str:
            if not x.isascii() or (x[:1] in _DECIMAL_START and _DECIMAL_STR.fullmatch(x)):
                return True
        elif t is dict:
            for k, v in x.items():
                if not k.isascii():
                    return True
                stack.append(v)
        elif t is list:
            stack.extend(x)
    return False


#: a place in JSON data while ``equal_meaning`` walks it: ``(parent, key or index)``, made a
#: ``Where`` (``_steps_of``) only for a message
_At = tuple[Any, str | int] | None


def _spelled(py: Any, data: Any, root: str, where: _At) -> Any:
    if isinstance(py, enum.Enum):
        py = py.value
    elif isinstance(py, BaseModel) and type(py).__pydantic_root_model__:
        py = getattr(py, "root", None)
    t = type(data)
    if t is str:
        if isinstance(py, decimal.Decimal) and data == str(py):
            text = decimal_text(py)
            return data if text == data else text
        return data if data.isascii() else _nfc(data)
    if t is list:
        items = py if isinstance(py, list | tuple) and len(py) == len(data) else None
        changed: list[Any] | None = None
        for i, v in enumerate(data):
            spelled = _spelled(items[i] if items else None, v, root, (where, i))
            if spelled is not v and changed is None:
                changed = data[:i]
            if changed is not None:
                changed.append(spelled)
        return data if changed is None else changed
    if t is dict:
        return _spelled_mapping(py, data, root, where)
    return data


def _spelled_mapping(py: Any, data: dict[str, Any], root: str, where: _At) -> Any:
    fields = _held(py)
    out: dict[str, Any] = {}
    changed = False
    for k, v in data.items():
        name = k if k.isascii() else _nfc(k)
        held = _MISSING if fields is None else _get(fields, k)
        spelled = _spelled(None if held is _MISSING else held, v, root, (where, k))
        if name in out:
            at = path_text(root, _steps_of(where))
            raise UnserializableInput(f"{at} has two keys that are one string in Unicode NFC")
        out[name] = spelled
        changed = changed or name is not k or spelled is not v
    return out if changed else data


def _steps_of(where: _At) -> Where:
    """A place of the JSON data (``(parent, key or index)``) as ``path_text`` reads it."""
    found: list[Any] = []
    while where is not None:
        where, at = where
        found.append(at)
    place: Where = None
    for at in reversed(found):
        place = (place, f"[{at}]" if type(at) is int else key_step(at))
    return place


_MISSING = object()


def _held(py: Any) -> Mapping[Any, Any] | None:
    """What ``py`` holds by the names its JSON object writes (None: not a container of names)."""
    if isinstance(py, Mapping):
        return py
    if isinstance(py, BaseModel):
        fields: dict[str, Any] = {}
        for name, info in type(py).model_fields.items():
            fields[name] = value = getattr(py, name, None)
            alias = info.serialization_alias or info.alias
            if alias:
                fields[alias] = value
        fields.update(py.model_extra or {})
        return fields
    if dataclasses.is_dataclass(py) and not isinstance(py, type):
        return {f.name: getattr(py, f.name) for f in dataclasses.fields(py)}
    return None


def _get(held: Mapping[Any, Any], key: str) -> Any:
    try:
        return held.get(key, _MISSING)
    except Exception:  # a mapping of keys a str does not compare with
        return _MISSING


def _nfc(text: str) -> str:
    spelled = unicodedata.normalize("NFC", text)
    return text if spelled == text else spelled


def effect_id(
    effect_type: str,
    key: Any,
    *,
    key_json: bytes | None = None,
    keyed: Callable[[bytes], str] | None = None,
) -> str:
    """The effect's identity: 256 bits of sha256 over the effect type and the approved key,
    spelled as ``equal_meaning`` spells it. ``key_json``, the key's canonical JSON so spelled
    when the caller has it already, saves making it again; the bytes hashed are the same.
    ``keyed``: the digest of a journal whose ids are keyed (HMAC-SHA256 under a key only the
    journal's holders have, so an id of a small key such as ``{order, amount}`` cannot be
    reversed by trying values), over the same bytes."""
    if not effect_type:
        raise ValueError("effect_type must be a non-empty string")
    if key_json is None:
        key_json = canonical_json(equal_meaning(key, jsonable(key, "key"), "key"))
    # the canonical object, keys in code-unit order ("effect_type" < "key")
    document = b'{"effect_type":' + canonical_json(effect_type) + b',"key":' + key_json + b"}"
    if keyed is not None:
        return keyed(document)
    return hashlib.sha256(document).hexdigest()


def origin_of(
    workflow_id: str | None, run_id: str | None, activity_id: str | None, input_digest: str
) -> str | None:
    """Which Temporal activity first proposed an effect, with which input: the same for every
    attempt of that activity. Two effects of one origin mean the key changed between attempts
    (it was not a function of the input alone). None outside Temporal."""
    if not (workflow_id and run_id and activity_id):
        return None
    text = f"{workflow_id}\x00{run_id}\x00{activity_id}\x00{input_digest}"
    return hashlib.sha256(text.encode()).hexdigest()
