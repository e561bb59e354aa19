"""A/B of naming an effect: ``identify`` (the effect id and the proposed payload's digest) of a
fresh ``Call``, a git revision's core against the working tree's, in one process, interleaved.

    python -m benchmarks.identify_ab --base 92ab32d --runs 4

Two inputs: the README's refund (integer cents, ASCII strings: nothing to respell) and one
whose key holds a Decimal with trailing zeros and a non-ASCII string (both spellings are made).
Each run times ``--calls`` fresh calls per side and input (a ``Call`` computes its name once),
thread CPU, and takes the median of 7 such batches; sides alternate within a run. Prints each
side's median per call (µs) and new ÷ base. The base's ``core`` is imported beside the working
tree's as ``gate_cpu_ab`` does it.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from .gate_cpu_ab import extract_base


class CentsRefund(BaseModel):
    case_id: str
    order_id: str
    amount_cents: int
    reason: str
    premises: dict[str, str]


class DollarRefund(BaseModel):
    case_id: str
    order_id: str
    amount: Decimal


CENTS = CentsRefund(
    case_id="c-1", order_id="o-1", amount_cents=2000, reason="late", premises={"s": "paid"}
)
DOLLARS = DollarRefund(case_id="café", order_id="o-1", amount=Decimal("30.00"))


def maker(calls: ModuleType, request: BaseModel, key: dict[str, Any]) -> Callable[[], Any]:
    def make() -> Any:
        return calls.Call(
            effect_type="refund",
            activity="refund",
            input=request,
            args=(request,),
            key=key,
            principal="refund-bot",
            lease_id="lease",
            measure=None,
            delivery=calls.Delivery(workflow_id="wf", run_id="r", activity_id="1", attempt=1),
            decode_args=lambda blob: blob,
            param_names=("r",),
        )

    return make


def per_call_us(calls: ModuleType, make: Callable[[], Any], n: int) -> float:
    batches = []
    for _ in range(7):
        fresh = [make() for _ in range(n)]
        start = time.thread_time()
        for call in fresh:
            calls.identify(call)
        batches.append((time.thread_time() - start) / n * 1e6)
    return statistics.median(batches)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.identify_ab")
    p.add_argument("--base", default="HEAD", help="the git revision to compare with")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base_name = extract_base(args.base, Path(tmp))
        sides = {
            "base": importlib.import_module(f"{base_name}.core.protocol.calls"),
            "new": importlib.import_module("interlock_temporal.core.protocol.calls"),
        }
        inputs: dict[str, tuple[BaseModel, dict[str, Any]]] = {
            "refund in cents": (CENTS, {"case": "c-1", "order": "o-1"}),
            "Decimal and non-ASCII key": (DOLLARS, {"case": "café", "amount": Decimal("30.00")}),
        }
        seen: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs):
            order = list(sides) if run % 2 == 0 else list(reversed(sides))
            for label, (request, key) in inputs.items():
                for side in order:
                    make = maker(sides[side], request, key)
                    seen.setdefault((label, side), []).append(
                        per_call_us(sides[side], make, args.calls)
                    )
    print(f"identify per fresh call, thread CPU, median of {args.runs} runs (base {args.base})")
    for label in inputs:
        base = statistics.median(seen[(label, "base")])
        new = statistics.median(seen[(label, "new")])
        print(f"  {label:28} base {base:7.1f} µs  new {new:7.1f} µs  new ÷ base {new / base:.2f}")


if __name__ == "__main__":
    main()
