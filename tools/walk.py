"""How far a reader walks to follow one gated call: the package's modules a real call passes
through, traced (``sys.setprofile``), for docs/architecture.md and issue notes.

Two walks, each on a new effect:

- **adapter**: a gated activity run by a real worker on a real dev server, from the
  interceptor's ``execute_activity`` until ``Gate.begin`` is called;
- **core**: ``Gate.begin`` on an SQLite journal, from its call until it returns the ticket.

For each it counts the **rooms** (distinct modules of the package entered), the **hops** (calls
whose callee's module is not its caller's, the caller being the nearest frame in the package)
and the **calls** (new frames in the package; a coroutine resumed is not a new call). Every
function counts, helpers included: compare two revisions on the same definition, never with a
hand count. ``python tools/walk.py`` prints both walks as JSON, ``--list`` the hops in order.
Runs against whatever ``interlock_temporal`` its interpreter imports, so an older checkout is
measured with ``cd old && python /path/to/tools/walk.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from temporalio import activity, workflow

from interlock_temporal import current_effect, gated
from interlock_temporal.targets.payments import RefundRequest, RefundResult
from interlock_temporal.workflow import act_as

PACKAGE = "interlock_temporal"
ANONYMOUS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")


@dataclass
class Walk:
    """What a traced stretch of a call entered."""

    rooms: list[str] = field(default_factory=list)
    hops: list[tuple[str, str]] = field(default_factory=list)
    calls: int = 0
    _seen: set[int] = field(default_factory=set)
    _frames: list[FrameType] = field(default_factory=list)

    def enter(self, frame: FrameType) -> None:
        if id(frame) in self._seen:
            return  # a coroutine resumed
        self._seen.add(id(frame))
        self._frames.append(frame)  # kept alive, so no later frame reuses its id
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE) or frame.f_code.co_name in ANONYMOUS:
            return
        self.calls += 1
        if module not in self.rooms:
            self.rooms.append(module)
        caller = frame.f_back
        while caller is not None and not caller.f_globals.get("__name__", "").startswith(PACKAGE):
            caller = caller.f_back
        if caller is not None and caller.f_globals["__name__"] != module:
            self.hops.append((caller.f_globals["__name__"], f"{module}.{frame.f_code.co_name}"))

    def summary(self) -> dict[str, Any]:
        return {"rooms": len(self.rooms), "hops": len(self.hops), "calls": self.calls}


def profiler(walk: Walk, armed: Callable[[FrameType, str], bool]) -> Any:
    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and armed(frame, event):
            walk.enter(frame)

    return profile


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


async def core_walk() -> Walk:
    """``Gate.begin`` for a new refund-shaped effect (the benchmarks' call) on SQLite."""
    from benchmarks.gate_cost import TrivialTarget, make_call, open_bench_journal
    from interlock_temporal.core.protocol import Gate, Ticket

    with tempfile.TemporaryDirectory() as tmp:
        journal = open_bench_journal(Path(tmp) / "walk.db")
        gate = Gate(journal)
        target = TrivialTarget()
        for i in range(3):  # warm: the first effects open what later ones reuse
            await gate.run(make_call("warm", i), target, _sent)
        walk = Walk()
        sys.setprofile(profiler(walk, lambda frame, event: True))
        try:
            step = await gate.begin(make_call("walk", 0), target)
        finally:
            sys.setprofile(None)
        assert isinstance(step, Ticket)
        await gate.commit(step, {"refund_id": "re_walk"})
        journal.close()
    return walk


async def _sent(ticket: Any) -> dict[str, str]:
    return {"refund_id": "re_walk"}


#: the payments service the traced refund sends to (set by ``adapter_walk``)
PAYMENTS: list[Any] = []


@activity.defn(name="walk_refund")
@gated(key=lambda r: {"order": r.order_id})
async def walk_refund(r: RefundRequest) -> RefundResult:
    result: RefundResult = await PAYMENTS[0].refund(
        r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
    )
    return result


@workflow.defn(name="WalkRefund", sandboxed=False)
class WalkRefund:
    @workflow.run
    async def run(self, lease: str) -> str:
        request = RefundRequest(case_id="c-1", order_id="o-1", amount_cents=1_000)
        with act_as("walk-bot", lease=lease):
            done = await workflow.execute_activity(
                walk_refund,
                request,
                start_to_close_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=5),
            )
        return str(done.refund_id)


async def adapter_walk() -> Walk:
    """A gated refund on a real worker, from ``execute_activity`` until ``Gate.begin``."""
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from interlock_temporal import InterlockPlugin, open_journal
    from interlock_temporal.testing import local_environment, simulated_payments

    walk = Walk()
    state = {"on": False}

    def armed(frame: FrameType, event: str) -> bool:
        name = frame.f_code.co_name
        if name == "execute_activity" and "interceptor" in _module(frame):
            state["on"] = True
        elif name == "begin" and _module(frame).startswith(f"{PACKAGE}.core.protocol"):
            state["on"] = False
        return state["on"]

    with tempfile.TemporaryDirectory() as tmp:
        payments = simulated_payments(Path(tmp), tier=2)
        payments.open_order("o-1", 10_000)
        PAYMENTS[:] = [payments]
        url = f"sqlite:///{Path(tmp) / 'interlock.db'}"
        key = "24" * 32
        journal = open_journal(url, signing_key=key)
        lease = journal.leases.issue("walk-bot", activities=["walk_refund"], ttl=timedelta(hours=1))
        journal.close()
        plugin = InterlockPlugin(journal=url, signing_key=key, targets={"walk_refund": payments})
        async with local_environment(plugins=[plugin]) as env:
            queue = f"walk-{uuid.uuid4()}"
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=[WalkRefund],
                activities=[walk_refund],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ):
                sys.setprofile(profiler(walk, armed))
                try:
                    await env.client.execute_workflow(
                        WalkRefund.run, lease, id=f"walk-{uuid.uuid4()}", task_queue=queue
                    )
                finally:
                    sys.setprofile(None)
    return walk


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print each hop in order")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    walks = {"adapter": asyncio.run(adapter_walk()), "core": asyncio.run(core_walk())}
    print(json.dumps({name: walk.summary() for name, walk in walks.items()}))
    if args.list:
        for name, walk in walks.items():
            print(f"\n{name}: rooms {', '.join(walk.rooms)}")
            for caller, callee in walk.hops:
                print(f"  {caller} -> {callee}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
