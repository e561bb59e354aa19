"""Talking to Temporal: the address and namespace, the client, RPC failures as one line.

Temporal is imported inside the functions, so commands that never talk to a server never load it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

# where a review's client and the commands tell RPC and workflow failures apart
from .._reviews.deciding import failure_message as failure_message
from .._reviews.deciding import is_not_found as is_not_found
from ._shared import (
    DEFAULT_ADDRESS,
    DEFAULT_NAMESPACE,
    EXIT_FAILED,
    EXIT_SERVER,
    EXIT_USAGE,
    CliError,
    Handler,
)

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.converter import PayloadCodec
    from temporalio.service import RPCError


def temporal_address(args: argparse.Namespace) -> str:
    """``--address``, else ``$TEMPORAL_ADDRESS``, else ``localhost:7233``."""
    given: str | None = getattr(args, "address", None)
    return given or os.environ.get("TEMPORAL_ADDRESS") or DEFAULT_ADDRESS


def temporal_namespace(args: argparse.Namespace) -> str:
    """``--namespace``, else ``$TEMPORAL_NAMESPACE``, else ``default``."""
    given: str | None = getattr(args, "namespace", None)
    return given or os.environ.get("TEMPORAL_NAMESPACE") or DEFAULT_NAMESPACE


def payload_codec(args: argparse.Namespace) -> PayloadCodec | None:
    """``--codec module:attr``, loaded (None when not given); a bad spec is a usage error."""
    spec: str | None = getattr(args, "codec", None)
    if not spec:
        return None
    from .._worker.codec import codec_from_spec

    try:
        return codec_from_spec(spec)
    except ValueError as err:
        raise CliError(EXIT_USAGE, str(err)) from None


def _reason(err: BaseException) -> str:
    """The telling part of a connection error, on one line."""
    text = str(err) or type(err).__name__
    found = re.search(r'message: "([^"]+)"', text) or re.search(r'error: "([^"]+)"', text)
    if found is not None:
        return found.group(1)
    return " ".join(text.split())[:200]


async def connect(args: argparse.Namespace) -> Client:
    """A client for ``--address`` and ``--namespace``, with the pydantic data converter."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    address = temporal_address(args)
    converter = pydantic_data_converter
    codec = payload_codec(args)
    if codec is not None:
        converter = dataclasses.replace(converter, payload_codec=codec)
    try:
        return await Client.connect(
            address, namespace=temporal_namespace(args), data_converter=converter
        )
    except Exception as err:  # RuntimeError when refused, ValueError for a malformed address
        raise CliError(
            EXIT_SERVER, f"Temporal at {address} cannot be reached: {_reason(err)}"
        ) from None


def _server_error(err: RPCError, args: argparse.Namespace) -> CliError:
    from temporalio.service import RPCStatusCode

    address = temporal_address(args)
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return CliError(EXIT_SERVER, f"Temporal at {address} cannot be reached: {err.message}")
    if err.status == RPCStatusCode.NOT_FOUND and "namespace" in err.message.lower():
        return CliError(
            EXIT_SERVER, f"namespace {temporal_namespace(args)} not found on Temporal at {address}"
        )
    return CliError(EXIT_FAILED, f"Temporal at {address}: {err.message or err.status.name}")


ServerCommand = Callable[[argparse.Namespace, "Client"], Awaitable[int]]


def on_server(body: ServerCommand) -> Handler:
    """A handler that connects to Temporal, runs ``body`` and turns RPC failures into one line."""

    def handler(args: argparse.Namespace) -> int:
        failure: Exception | None = None
        code = EXIT_FAILED
        try:
            code = asyncio.run(_with_client(body, args))
        except Exception as err:
            if os.environ.get("INTERLOCK_DEBUG"):
                raise
            # without its traceback and chain: their frames hold the client
            failure = err.with_traceback(None)
            failure.__cause__ = failure.__context__ = None
        # Free the client now, not during interpreter shutdown: the SDK's native client dropped
        # while Python finalizes can abort the process after the command did its work
        # ("PyGILState_Release: thread state ... must be current", temporalio/sdk-python#300).
        gc.collect()
        if failure is not None:
            raise failure
        return code

    return handler


async def _with_client(body: ServerCommand, args: argparse.Namespace) -> int:
    from temporalio.service import RPCError

    client = await connect(args)
    try:
        return await body(args, client)
    except RPCError as err:
        raise _server_error(err, args) from None
