"""Effect identity: derived from the approved request, never from a delivery.

``effect_id = sha256(JCS({"effect_type": ..., "key": ...}))`` where JCS is RFC 8785 canonical
JSON, so any language can recompute an id from the same decision.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import rfc8785
from pydantic_core import to_jsonable_python


class UnserializableInput(TypeError):
    """A value that has no canonical JSON form (so it cannot name or digest an effect)."""


def jsonable(value: Any) -> Any:
    """The JSON data model of ``value`` (pydantic models, dataclasses, datetimes included).

    A ``SecretStr`` becomes its mask, so secrets never reach a digest input or the journal.
    """
    try:
        return to_jsonable_python(value)
    except Exception as err:  # pydantic raises PydanticSerializationError
        raise UnserializableInput(f"value of type {type(value).__name__} is not JSON data") from err


_SAFE_INT = 2**53 - 1


def _json_module_is_canonical(data: Any) -> bool:
    """Whether ``json.dumps(sort_keys=True)`` already writes the RFC 8785 bytes of ``data``.

    It does when every string is ASCII (so sorting by code point is sorting by UTF-16 unit, and
    there is no lone surrogate), every integer is in the interoperable range, and every float
    is written the same way by Python's ``repr`` and ECMAScript's ``Number.toString``: finite,
    not integral, and between 1e-4 and 1e16 in magnitude (both then print plain shortest
    round-trip digits). Anything else goes through the reference implementation.
    """
    stack = [data]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is str:
            if not x.isascii():
                return False
        elif t is dict:
            for k, v in x.items():
                if type(k) is not str or not k.isascii():
                    return False
                stack.append(v)
        elif t is list:
            stack.extend(x)
        elif t is int:
            if not -_SAFE_INT <= x <= _SAFE_INT:
                return False
        elif t is float:
            if not (1e-4 <= abs(x) < 1e16) or x.is_integer():
                return False
        elif not (t is bool or x is None):
            return False
    return True


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
    except rfc8785.CanonicalizationError:
        # the library's message can quote the value; never echo argument values
        raise UnserializableInput("a value with no canonical JSON form") from None
    except UnicodeError:
        raise UnserializableInput("a string that is not valid Unicode (a lone surrogate)") from None


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of ``value`` (models, dataclasses, datetimes included)."""
    return canonical_json(jsonable(value))


def digest(value: Any) -> str:
    """Hex sha256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()


def effect_id(effect_type: str, key: Any, *, key_json: bytes | None = None) -> str:
    """The effect's identity: 256 bits of sha256 over the effect type and the approved key.
    ``key_json``, the key's canonical JSON when the caller has it already, saves making it
    again; the bytes hashed are the same."""
    if not effect_type:
        raise ValueError("effect_type must be a non-empty string")
    if key_json is None:
        return digest({"effect_type": effect_type, "key": key})
    # the canonical object, keys in code-unit order ("effect_type" < "key")
    document = b'{"effect_type":' + canonical_json(effect_type) + b',"key":' + key_json + b"}"
    return hashlib.sha256(document).hexdigest()
