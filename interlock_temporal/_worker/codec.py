"""The journal's values through the user's ``PayloadCodec`` (``core.sealing``'s ``Sealer``).

A value's canonical JSON goes into a Temporal ``Payload`` (encoding ``json/plain``), through
the codec's ``encode``, and the encoded payload's protobuf bytes are stored as base64: the same
bytes the codec would put in a workflow history, so whatever decodes the user's payloads (their
codec server included) decodes these. ``codec_from_spec`` loads ``--codec module:attr`` for the
CLI."""

from __future__ import annotations

import base64
import importlib

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from ..core.sealing import Sealer

#: the scheme sealed values carry: a Temporal payload, encoded by the client's codec
SCHEME = "temporal-codec/v1"


class CodecSealer(Sealer):
    """Seals journal values with a Temporal ``PayloadCodec``."""

    scheme = SCHEME

    def __init__(self, codec: PayloadCodec) -> None:
        self.codec = codec

    async def seal(self, data: bytes) -> str:
        payload = Payload(metadata={"encoding": b"json/plain"}, data=data)
        (encoded,) = await self.codec.encode([payload])
        return base64.b64encode(encoded.SerializeToString()).decode()

    async def unseal(self, scheme: str, data: str) -> bytes:
        if scheme != SCHEME:
            raise ValueError(f"a value sealed as {scheme!r}, which this version cannot decode")
        payload = Payload()
        payload.ParseFromString(base64.b64decode(data))
        (decoded,) = await self.codec.decode([payload])
        return bytes(decoded.data)


def codec_from_spec(spec: str) -> PayloadCodec:
    """``module:attr``: a ``PayloadCodec`` instance, or a factory (a class or a function taking
    no argument) that returns one. ``ValueError`` says what is wrong, naming the spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--codec {spec!r} is not module:attr")
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--codec {spec!r}: cannot import {module_name} ({err})") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ValueError(f"--codec {spec!r}: {module_name} has no {attr}")
        found = getattr(found, part)
    if not isinstance(found, PayloadCodec) and callable(found):
        found = found()
    if not isinstance(found, PayloadCodec):
        raise ValueError(f"--codec {spec!r} is not a PayloadCodec nor a factory of one")
    return found
