"""The scripted models' scripts, one for every agent framework's story (the OpenAI Agents
SDK's, LangGraph's, Pydantic AI's): what the model asks, step by step. Plain data, so a
workflow module may import it too.

The model asks for $20 (``refund``); re-deciding, it asks again for $30 (``redecide``); greedy,
it asks for $50 first, then $20 (``greedy``). Each framework adds its ``naive`` script: the
unguarded tool takes the whole request, in its own shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """The model calls ``tool`` with these arguments."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Say:
    """The model's final message."""

    text: str


Step = Call | Say

#: the scripts every framework's stories use
SHARED_SCRIPTS: dict[str, tuple[Step, ...]] = {
    "refund": (
        Call("refund", {"amount_cents": 2000, "reason": "overcharged"}),
        Say("Your refund is on its way."),
    ),
    "redecide": (
        Call("refund", {"amount_cents": 2000, "reason": "overcharged"}),
        Call("refund", {"amount_cents": 3000, "reason": "overcharged, and for the trouble"}),
        Say("I could not refund more; a colleague will follow up."),
    ),
    "greedy": (
        Call("refund", {"amount_cents": 5000, "reason": "overcharged, and for the trouble"}),
        Call("refund", {"amount_cents": 2000, "reason": "overcharged"}),
        Say("Your refund of $20 is on its way."),
    ),
}
