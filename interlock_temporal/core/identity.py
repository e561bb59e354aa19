"""Effect identity: derived from the approved request, never from a delivery.

``effect_id = sha256(JCS({"effect_type": ..., "key": ...}))`` where JCS is RFC 8785 canonical
JSON, so any language can recompute an id from the same decision.
"""

from __future__ import annotations

import hashlib
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


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of ``value``."""
    try:
        return rfc8785.dumps(jsonable(value))
    except rfc8785.IntegerDomainError:
        raise UnserializableInput(
            "an integer outside the interoperable JSON range (2**53)"
        ) from None
    except rfc8785.FloatDomainError:
        raise UnserializableInput("a float that is NaN or infinite") from None
    except rfc8785.CanonicalizationError:
        # the library's message can quote the value; never echo argument values
        raise UnserializableInput("a value with no canonical JSON form") from None


def digest(value: Any) -> str:
    """Hex sha256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()


def effect_id(effect_type: str, key: Any) -> str:
    """The effect's identity: 256 bits of sha256 over the effect type and the approved key."""
    if not effect_type:
        raise ValueError("effect_type must be a non-empty string")
    return digest({"effect_type": effect_type, "key": key})
