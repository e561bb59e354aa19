"""Effect identity: derived from the approved request, never from a delivery.

``effect_id = sha256(JCS({"effect_type": ..., "key": ...}))`` where JCS is RFC 8785 canonical
JSON, so any language can recompute an id from the same decision.
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
import uuid
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import rfc8785
from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic_core import to_jsonable_python


class UnserializableInput(TypeError):
    """A value that has no canonical JSON form (so it cannot name or digest an effect)."""


def jsonable(value: Any, path: str | None = None) -> Any:
    """The JSON data model of ``value`` (pydantic models, dataclasses, datetimes included).

    A ``SecretStr`` becomes its mask, so secrets never reach a digest input or the journal.
    What is not JSON data is refused naming where it is, from ``path`` (the name ``value`` has
    for the reader, e.g. ``key``) down, and its type: ``key['order']['when']: Clock is not
    JSON data``. Never the value.
    """
    try:
        return to_jsonable_python(value)
    except Exception as err:  # pydantic raises PydanticSerializationError
        where, culprit = _not_json_part(value, path or "value")
        if path is None and culprit is value:
            raise UnserializableInput(
                f"value of type {type(culprit).__name__} is not JSON data"
            ) from err
        raise UnserializableInput(f"{where}: {type(culprit).__name__} is not JSON data") from err


def item_path(where: str, key: object) -> str:
    """The path of an entry of a mapping, as Python indexes it: ``key['order']``."""
    return f"{where}[{key!r}]"


def _parts(x: Any, where: str) -> list[tuple[Any, str]]:
    """The values ``x`` holds, each with its path (none for a leaf)."""
    if isinstance(x, BaseModel):
        named = [(getattr(x, name), f"{where}.{name}") for name in type(x).model_fields]
        return named + [(v, f"{where}.{k}") for k, v in (x.model_extra or {}).items()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(getattr(x, f.name), f"{where}.{f.name}") for f in dataclasses.fields(x)]
    if isinstance(x, Mapping):
        return [(v, item_path(where, k)) for k, v in x.items()]
    if isinstance(x, list | tuple):
        return [(v, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, set | frozenset):
        return [(v, f"an item of {where}") for v in x]
    return []


def _serializes(x: Any) -> bool:
    try:
        to_jsonable_python(x)
    except Exception:
        return False
    return True


def _not_json_part(value: Any, where: str) -> tuple[str, Any]:
    """(path, value) of the innermost part of ``value`` that does not serialize: a part whose
    own parts all do (an unknown object, or a container pydantic cannot write)."""
    while True:
        for part, path in _parts(value, where):
            if not _serializes(part):
                value, where = part, path
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
    change between attempts. Names the path and the type, never the value. ``allow_bytes``: an
    input that is not the key may carry bytes (an attachment): they digest the same
    everywhere, but a key names a decision in JSON any language can recompute."""
    if _plainly_stable(value):
        return None
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        x, where = stack.pop()
        if x is None or isinstance(x, _STABLE_LEAVES):
            continue
        if isinstance(x, int):
            if not -_SAFE_INT <= x <= _SAFE_INT:
                return f"{where} is an integer outside the interoperable JSON range (2**53)"
            continue
        if isinstance(x, float | decimal.Decimal):
            if not math.isfinite(x):
                return f"{where} is a {type(x).__name__} that is NaN or infinite"
            continue
        if isinstance(x, enum.Enum):
            stack.append((x.value, where))
        elif isinstance(x, BaseModel):
            fields = type(x).model_fields
            stack.extend((getattr(x, name), f"{where}.{name}") for name in fields)
            stack.extend((v, f"{where}.{k}") for k, v in (x.model_extra or {}).items())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend((getattr(x, f.name), f"{where}.{f.name}") for f in dataclasses.fields(x))
        elif isinstance(x, Mapping):
            for k, v in x.items():
                if not isinstance(k, str):
                    return f"{where} has a key of type {type(k).__name__}, not a string"
                stack.append((v, item_path(where, k)))
        elif isinstance(x, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(x))
        elif isinstance(x, set | frozenset):
            return (
                f"{where} is a {type(x).__name__}, which has no order: its JSON changes between "
                "processes (use a sorted list)"
            )
        elif isinstance(x, bytes | bytearray | memoryview):
            if not allow_bytes:
                return f"{where} is {type(x).__name__}, which has no canonical JSON form"
        else:
            return f"{where}: {type(x).__name__} is not JSON data"
    return None


def _plainly_stable(data: Any) -> bool:
    """The fast answer for the common case: plain JSON data (and models of it) with no value
    ``unstable_part`` refuses. False sends the value through ``unstable_part``'s full walk,
    which also builds the path it names."""
    stack = [data]
    while stack:
        x = stack.pop()
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
            for k, v in x.items():
                if type(k) is not str:
                    return False
                stack.append(v)
        elif t is list or t is tuple:
            stack.extend(x)
        elif isinstance(x, BaseModel):
            stack.extend(getattr(x, name) for name in type(x).model_fields)
            if x.model_extra:
                stack.append(x.model_extra)
        elif not isinstance(x, _STABLE_LEAVES):
            return False
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


def effect_id(
    effect_type: str,
    key: Any,
    *,
    key_json: bytes | None = None,
    keyed: Callable[[bytes], str] | None = None,
) -> str:
    """The effect's identity: 256 bits of sha256 over the effect type and the approved key.
    ``key_json``, the key's canonical JSON when the caller has it already, saves making it
    again; the bytes hashed are the same. ``keyed``: the digest of a journal whose ids are
    keyed (HMAC-SHA256 under a key only the journal's holders have, so an id of a small key
    such as ``{order, amount}`` cannot be reversed by trying values), over the same bytes."""
    if not effect_type:
        raise ValueError("effect_type must be a non-empty string")
    if key_json is None:
        key_json = canonical_json(jsonable(key, "key"))
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
