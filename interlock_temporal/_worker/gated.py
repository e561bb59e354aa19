"""``gated(...)``: declares an activity's effect (target, key, premises) and refuses to run its
body unless the Interlock interceptor is running the effect protocol around it; and what one
attempt of a gated activity is for the core (``call_of``: its ``Call``), built here, where the
declaration that reads it is.

The target may be declared here (``@gated(target=payments)``) or bound by the worker, by
activity name (``gated(refund)`` with ``InterlockPlugin(targets={"refund": payments})``);
everything else (key, premises, amount, resource, effect type) is declared where the activity
is, since it is part of what the effect *is*, not of where it runs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar, cast, get_type_hints, overload

from pydantic import TypeAdapter
from temporalio import activity
from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter

from ..core.protocol import Call, Delivery, Done, Measure, Ticket
from ..core.targets import EffectTarget, check_declaration, runs_transactions
from .context import Authority
from .errors import InterlockNotInstalled, InvalidEffectInput, describe_invalid

P = ParamSpec("P")
R = TypeVar("R")

SPEC_ATTR = "__interlock_gate__"


@dataclass(frozen=True)
class EffectContext:
    """What the body of a gated activity may know about its effect."""

    effect_id: str
    effect_type: str
    via: str
    dispatch_no: int
    attempt: int
    principal: str | None
    #: how often the body asked ``current_effect()`` for this effect (a list, so that the
    #: frozen context is shared with the tasks and threads the body starts)
    _reads: list[None] = field(default_factory=list, compare=False, repr=False)

    @property
    def was_read(self) -> bool:
        """Whether the body asked ``current_effect()`` for it: without that, the effect id
        cannot have reached the target (as its idempotency key or lookup tag)."""
        return bool(self._reads)

    @property
    def idempotency_key(self) -> str:
        """The key to send to a target that dedupes: the effect id itself."""
        return self.effect_id

    def report_cost(self, usd: float) -> None:
        """What this call actually cost: the policy's budgets are charged with it, once, in
        place of the estimate."""
        report_cost(usd)


#: what the running activity reported it cost (``report_cost``), while the interceptor meters it
_cost: ContextVar[list[float] | None] = ContextVar("interlock_cost", default=None)


def report_cost(usd: float) -> None:
    """Report what the running activity actually cost, in USD (gated or not). The budget was
    charged the estimate when the call was allowed; this replaces it, once."""
    if isinstance(usd, bool) or not isinstance(usd, int | float) or not 0 <= usd < float("inf"):
        raise ValueError("report_cost: usd must be a finite, non-negative number")
    meter = _cost.get()
    if meter is None:
        raise RuntimeError("report_cost() is only available inside an activity under a policy")
    meter.append(float(usd))


@contextlib.contextmanager
def metering() -> Iterator[list[float]]:
    """Meter the activity that runs inside: the costs it reports (``report_cost``), in order.
    The tasks it starts share the list (they copy the context, and with it the same list)."""
    spent: list[float] = []
    token = _cost.set(spent)
    try:
        yield spent
    finally:
        _cost.reset(token)


#: the gated body allowed to run, and the effect it sends, while the interceptor starts it
_current: ContextVar[tuple[GateSpec, EffectContext] | None] = ContextVar(
    "interlock_effect", default=None
)


def current_effect() -> EffectContext:
    """The effect the running gated activity body is sending (its ``effect_id`` is the
    idempotency key to pass to the target)."""
    entry = _current.get()
    if entry is None:
        raise RuntimeError("current_effect() is only available inside a gated activity body")
    effect = entry[1]
    if not effect._reads:
        effect._reads.append(None)
    return effect


@contextlib.contextmanager
def running(spec: GateSpec, effect: EffectContext) -> Iterator[None]:
    """Let the body of ``spec`` run, sending ``effect``: a task started inside copies the
    context, so its body passes the wrapper's check and ``current_effect()`` gives ``effect``;
    the caller's own context is as it was once the block ends."""
    token = _current.set((spec, effect))
    try:
        yield
    finally:
        _current.reset(token)


@dataclass(frozen=True)
class Inputs:
    """A gated activity's parameters: decodes its arguments (raw from Temporal, or the recorded
    approved input) into their types. Knows nothing else of the activity: the reconciler
    decodes with it and never holds the body."""

    label: str
    param_names: tuple[str, ...]
    arg_types: tuple[Any, ...]
    _adapters: dict[int, TypeAdapter[Any]] = field(default_factory=dict, compare=False)

    def _adapter(self, index: int) -> TypeAdapter[Any]:
        adapter = self._adapters.get(index)
        if adapter is None:
            adapter = TypeAdapter(self.arg_types[index])
            self._adapters[index] = adapter
        return adapter

    def decode(self, raw: Sequence[Any], converter: PayloadConverter) -> tuple[Any, ...]:
        """Arguments arrive raw (see ``gated``): decode and validate them here, so bad input
        fails once, non-retryably, naming the fields and never their values."""
        if len(raw) != len(self.arg_types):
            raise InvalidEffectInput(
                f"{self.label}: expected {len(self.arg_types)} argument(s) "
                f"({', '.join(self.param_names)}), got {len(raw)}"
            )
        values = []
        for index, (value, hint) in enumerate(zip(raw, self.arg_types, strict=True)):
            try:
                if isinstance(value, RawValue):
                    value = converter.from_payload(value.payload, hint)
                else:
                    value = self._adapter(index).validate_python(value)
            except Exception as err:
                raise InvalidEffectInput(
                    f"{self.label}: invalid input: {describe_invalid(err, self.param_names[index])}"
                ) from None
            values.append(value)
        return tuple(values)

    def decode_json(self, data: list[Any]) -> tuple[Any, ...]:
        """The recorded approved input (JSON data) as the body's argument types."""
        return self.decode(data, PayloadConverter.default)


@dataclass(frozen=True)
class GateSpec:
    fn: Callable[..., Any]
    #: None: bound by the worker, by activity name (``InterlockPlugin(targets=...)``)
    target: EffectTarget | None
    key: Callable[..., Any] | None
    #: None: the activity's name (as registered), resolved when the activity runs
    effect_type: str | None
    premises: str | None
    amount: Callable[..., int | None] | None
    resource: Callable[..., str | None] | None
    param_names: tuple[str, ...]
    arg_types: tuple[Any, ...]
    return_type: Any
    is_async: bool
    #: a body that takes its target's transaction first (``def credit(tx, req)``); the
    #: activity Temporal runs takes the arguments after it
    transaction: Callable[..., Any] | None = None
    inputs: Inputs = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", Inputs(self.label, self.param_names, self.arg_types))

    @property
    def label(self) -> str:
        return self.effect_type or str(getattr(self.fn, "__name__", "activity"))

    def bound_to(self, target: EffectTarget) -> GateSpec:
        """This gate with its target bound by a worker."""
        return dataclasses.replace(self, target=target)

    def require_target(self) -> EffectTarget:
        """The target (declared, or bound by the worker; a spec the worker runs has one)."""
        if self.target is None:
            raise TypeError(f"gated activity {self.label}: no target is bound")
        return self.target

    def decode(self, raw: Sequence[Any], converter: PayloadConverter) -> tuple[Any, ...]:
        return self.inputs.decode(raw, converter)

    def _extract(self, fn: Any, what: str, args: tuple[Any, ...], label: str) -> Any:
        try:
            return fn(*args)
        except Exception as err:
            raise InvalidEffectInput(
                f"{label}: the {what} function raised {type(err).__name__}"
            ) from None

    def key_of(self, args: tuple[Any, ...], label: str) -> Any:
        """The approved decision's key (None: the whole input is the key)."""
        if self.key is None:
            return None
        key = self._extract(self.key, "key", args, label)
        if key is None:
            raise InvalidEffectInput(f"{label}: the key function returned None")
        return key

    def measurer(self, label: str) -> Callable[[tuple[Any, ...]], Measure] | None:
        """Reads what a lease may cap from arguments (proposed, or recorded and approved)."""
        if self.amount is None and self.resource is None:
            return None

        def measure(args: tuple[Any, ...]) -> Measure:
            amount = self._extract(self.amount, "amount", args, label) if self.amount else None
            if amount is not None and (not isinstance(amount, int) or isinstance(amount, bool)):
                raise InvalidEffectInput(f"{label}: amount must return int cents")
            resource = (
                self._extract(self.resource, "resource", args, label) if self.resource else None
            )
            return Measure(amount, resource)

        return measure

    def decode_json(self, data: list[Any]) -> tuple[Any, ...]:
        return self.inputs.decode_json(data)


@overload
def gated(
    fn: Callable[P, R],
    *,
    target: EffectTarget | None = ...,
    key: Callable[..., Any] | None = ...,
    effect_type: str | None = ...,
    premises: str | None = ...,
    amount: Callable[..., int | None] | None = ...,
    resource: Callable[..., str | None] | None = ...,
) -> Callable[P, R]: ...


@overload
def gated(
    fn: None = ...,
    *,
    target: EffectTarget | None = ...,
    key: Callable[..., Any] | None = ...,
    effect_type: str | None = ...,
    premises: str | None = ...,
    amount: Callable[..., int | None] | None = ...,
    resource: Callable[..., str | None] | None = ...,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def gated(
    fn: Callable[P, R] | None = None,
    *,
    target: EffectTarget | None = None,
    key: Callable[..., Any] | None = None,
    effect_type: str | None = None,
    premises: str | None = None,
    amount: Callable[..., int | None] | None = None,
    resource: Callable[..., str | None] | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Gate an activity's side effect: ``@gated(...)`` under (or over) ``@activity.defn``, bare
    ``@gated``, or ``gated(refund, ...)`` around an activity, where the worker registers it
    (``activities=[gated(refund)]``): the activity keeps its name.

    - ``target``: the adapter of the system the body sends to (declares its tier; a
      declaration that does not add up raises ``TargetDeclarationError`` here). Leave it out
      to let the worker bind it by activity name: ``InterlockPlugin(targets={"refund": t})``.
      A worker that runs a gated activity with no target bound refuses to start.
    - ``key``: called with the activity's arguments, returns the JSON data that names the
      approved decision (e.g. the case and the order). Default: the whole input. Values of
      one meaning name one effect: a ``Decimal`` is written as its canonical text
      (``Decimal("30.00")`` and ``Decimal("30.0")`` as ``"30"``), strings and mapping keys in
      Unicode NFC. A Decimal is a JSON string, as pydantic writes a Decimal field: it names
      the same effect as the string of its canonical text, never as the number (``30``, or
      ``30.0``); keep an amount's type fixed in a key, or key on integer cents.
    - ``effect_type``: part of every effect id; default the activity's name. Declare it to
      keep ids stable across a rename of the activity.
    - ``premises``: the name of the input field that carries the facts the agent relied on
      when it decided; they are re-validated before the first send and every resend, and are
      not part of the payload digest.
    - ``amount`` / ``resource``: read the amount (cents) and the resource from the arguments,
      for leases that cap them.
    """

    def gate(body: Callable[P, R]) -> Callable[P, R]:
        transaction = None
        if target is not None and runs_transactions(target):
            transaction, body = body, _in_transaction(body, target)
        params, hints = _typed_parameters(body, premises)
        _check_functions(body, params, key=key, amount=amount, resource=resource)
        if target is not None:
            check_declaration(target)
        spec = GateSpec(
            fn=body,
            target=target,
            key=key,
            effect_type=effect_type,
            premises=premises,
            amount=amount,
            resource=resource,
            param_names=tuple(p.name for p in params),
            arg_types=tuple(hints[p.name] for p in params),
            return_type=hints.get("return"),
            is_async=inspect.iscoroutinefunction(body),
            transaction=transaction,
        )
        return cast(Callable[P, R], _wrap(body, spec, hints))

    def decorate(body: Callable[P, R]) -> Callable[P, R]:
        defined = _Definition.from_callable(body)
        if defined is not None:
            return cast(Callable[P, R], _regate(defined, gate))
        return gate(body)

    return decorate(fn) if fn is not None else decorate


def _typed_parameters(
    body: Callable[..., Any], premises: str | None
) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The body's parameters and type hints, refused where the gate could not decode them."""
    params = list(inspect.signature(body).parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        raise TypeError(f"gated activity {body.__name__}: only positional parameters")
    hints = get_type_hints(body)
    missing = [p.name for p in params if p.name not in hints]
    if missing:
        raise TypeError(
            f"gated activity {body.__name__}: parameters need type hints: {', '.join(missing)}"
        )
    if premises is not None and len(params) != 1:
        raise TypeError("premises= names a field of the input: the activity needs one argument")
    return params, hints


def _check_functions(
    body: Callable[..., Any], params: Sequence[inspect.Parameter], **given: Any
) -> None:
    """``key=``, ``amount=`` and ``resource=`` are functions of the activity's arguments: any
    other value (``key="customer_id"``, a field's name) is refused here, with the line to
    write, instead of failing every attempt at run time."""
    arg = params[0].name if len(params) == 1 else None
    for what, value in given.items():
        if value is None or callable(value):
            continue
        lam = f"lambda {', '.join(p.name for p in params) or ''}: "
        names = [value] if isinstance(value, str) else value
        fields = (
            list(names)
            if isinstance(names, list | tuple) and names and all(isinstance(n, str) for n in names)
            else []
        )
        if what == "key" and fields and arg is not None:
            pairs = ", ".join(f'"{f}": {arg}.{f}' for f in fields)
            line = f"key={lam}{{{pairs}}}"
        elif fields and arg is not None and len(fields) == 1:
            line = f"{what}={lam}{arg}.{fields[0]}"
        else:
            line = f"{what}={lam}..."
        raise TypeError(
            f"gated activity {getattr(body, '__name__', 'activity')}: {what}= takes a function "
            f"of the activity's arguments, not {value!r} (a {type(value).__name__}): write "
            f"{line}"
        )


def _in_transaction(body: Callable[..., Any], target: EffectTarget) -> Callable[..., Any]:
    """A body that takes its target's transaction first (``def credit(tx, req)``: an
    ``SqlTarget``) as the activity Temporal runs: it takes the parameters after ``tx``, and
    runs the body through the target (``target.run``: a transaction of the target's own, with
    the effect's marker). At tier 0 the gate runs the body inside the journal's transaction
    instead (``target.transact``), and this is only the way a resend goes."""
    name = getattr(body, "__name__", "activity")
    if inspect.iscoroutinefunction(body):
        raise TypeError(
            f"gated activity {name}: target {target.name} runs the body inside a database "
            "transaction: write it as a plain def (its statements are synchronous)"
        )
    params = list(inspect.signature(body).parameters.values())
    if not params:
        raise TypeError(
            f"gated activity {name}: target {target.name} runs the body inside a database "
            f"transaction: take it first, def {name}(tx: SqlTransaction, ...)"
        )
    hints = get_type_hints(body)
    rest = params[1:]
    run = target.run  # type: ignore[attr-defined]

    async def send(*args: Any) -> Any:
        return await asyncio.to_thread(run, body, args, current_effect().effect_id)

    functools.update_wrapper(send, body)
    del send.__wrapped__  # type: ignore[attr-defined]
    empty = inspect.Signature.empty
    send.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        rest, return_annotation=hints.get("return", empty)
    )
    send.__annotations__ = {p.name: hints[p.name] for p in rest if p.name in hints}
    if "return" in hints:
        send.__annotations__["return"] = hints["return"]
    return send


def _regate(
    defined: _Definition, gate: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> Callable[..., Any]:
    """An activity already defined (``gated(refund)``, or ``@gated`` over ``@activity.defn``):
    gate its function and define the result again as the same activity (its name, its thread
    cancellation setting). Temporal reads the definition through ``_Definition``, which is
    private to the SDK; no public API gives an activity's registered name."""
    if defined.name is None:
        raise TypeError("a dynamic activity cannot be gated: gate the activities it dispatches to")
    if spec_of(defined.fn) is not None:
        raise TypeError(f"activity {defined.name!r} is gated already")
    wrapper = gate(defined.fn)
    # functools.wraps copied the old definition onto the wrapper: define it anew
    vars(wrapper).pop("__temporal_activity_definition", None)
    return activity.defn(
        name=defined.name, no_thread_cancel_exception=defined.no_thread_cancel_exception
    )(wrapper)


def _wrap(body: Callable[..., Any], spec: GateSpec, hints: dict[str, Any]) -> Callable[..., Any]:
    """The activity Temporal registers: runs the body only inside the gate's protocol for
    ``spec``, and declares its parameters raw."""

    def check() -> None:
        entry = _current.get()
        # the spec running may be this one bound to a target by the worker: the same body
        if entry is None or entry[0].fn is not spec.fn:
            raise InterlockNotInstalled(body.__name__)

    wrapper: Callable[..., Any]
    if spec.is_async:

        @functools.wraps(body)
        async def async_wrapper(*args: Any) -> Any:
            check()
            return await body(*args)

        wrapper = async_wrapper
    else:

        @functools.wraps(body)
        def sync_wrapper(*args: Any) -> Any:
            check()
            # the send must not be interrupted by Temporal's cancellation of the attempt
            with activity.shield_thread_cancel_exception():
                return body(*args)

        wrapper = sync_wrapper

    # Temporal decodes arguments with the function's hints *before* any interceptor runs,
    # and a decoding error there is retried forever. Declaring the parameters raw lets the
    # interceptor decode them and fail bad input once, non-retryably, naming the field.
    sig = inspect.signature(body)
    raw_params = [p.replace(annotation=RawValue) for p in sig.parameters.values()]
    wrapper.__signature__ = sig.replace(  # type: ignore[union-attr]
        parameters=raw_params, return_annotation=hints.get("return", sig.return_annotation)
    )
    wrapper.__annotations__ = {
        **{p.name: RawValue for p in raw_params},
        **({"return": hints["return"]} if "return" in hints else {}),
    }
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    setattr(wrapper, SPEC_ATTR, spec)
    return wrapper


def check_executor(spec: GateSpec, executor: object, activity_name: str) -> None:
    """A plain ``def`` gated activity runs only in a thread of the worker's own process: the
    gate's context (``current_effect()``, the check that the gate runs the body) reaches the
    body through the thread's copy of it. In another process (a process pool) the body would
    see no gate, or, in a forked one, a stale copy: another effect's id as its idempotency key.
    Refused before anything is journaled or sent."""
    if spec.is_async or isinstance(executor, ThreadPoolExecutor):
        return
    raise InterlockNotInstalled(
        activity_name,
        f"is a plain def and this worker's activity_executor is a {type(executor).__name__}: "
        "the gate runs a plain def activity only in a thread of the worker's own process; give "
        "the worker activity_executor=concurrent.futures.ThreadPoolExecutor(...), or make the "
        "activity async def",
    )


def spec_of(fn: Any) -> GateSpec | None:
    spec = getattr(fn, SPEC_ATTR, None)
    return spec if isinstance(spec, GateSpec) else None


# -- one attempt of a gated activity, as the core sees it ---------------------------------------

#: how a Done says ``begin`` sent (and committed) the effect itself, for this attempt
SENT_NOW = ("dispatch", "reopened")


def call_of(
    spec: GateSpec, info: activity.Info, raw: Sequence[Any], authority: Authority | None
) -> Call:
    """The core's view of one attempt of a gated activity, and the only place the adapter builds
    a ``Call``: its arguments, raw from Temporal, decoded and validated as the activity declares
    them (bad input fails here, once, naming the fields), the effect's key and measure, who
    asks (the verified ``act_as`` authority) and which delivery carries it."""
    args = spec.decode(raw, activity.payload_converter())
    effect_type = spec.effect_type or info.activity_type
    return Call(
        effect_type=effect_type,
        activity=info.activity_type,
        input=args[0] if len(args) == 1 else args,
        args=args,
        key=spec.key_of(args, effect_type),
        premises_field=spec.premises,
        principal=authority.principal if authority else None,
        lease_id=authority.lease_id if authority else None,
        session=(authority.session if authority else None) or info.workflow_id,
        namespace=info.workflow_namespace,
        measure=spec.measurer(effect_type),
        delivery=delivery_of(info),
        last_attempt=is_last_attempt(info),
        decode_args=spec.decode_json,
        param_names=spec.param_names,
        transaction=_transaction_of(spec),
    )


def _transaction_of(spec: GateSpec) -> Any:
    """A body that takes its target's transaction, bound to the target's ``transact``: what the
    gate runs inside the journal's transaction for a tier-0 target."""
    if spec.transaction is None:
        return None
    transact = getattr(spec.require_target(), "transact", None)
    return None if transact is None else functools.partial(transact, spec.transaction)


def delivery_of(info: activity.Info) -> Delivery:
    """Which Temporal delivery carries this attempt (recorded, never part of the identity)."""
    return Delivery(
        workflow_id=info.workflow_id,
        run_id=info.workflow_run_id,
        activity_id=info.activity_id,
        attempt=info.attempt,
        task_queue=info.task_queue,
    )


def is_last_attempt(info: activity.Info, now: datetime | None = None) -> bool:
    """Whether Temporal will not schedule another attempt after this one fails."""
    policy = info.retry_policy
    if policy is not None and 0 < policy.maximum_attempts <= info.attempt:
        return True
    if info.schedule_to_close_timeout:
        now = now or datetime.now(UTC)
        deadline = info.scheduled_time + info.schedule_to_close_timeout
        interval = timedelta(seconds=1)
        if policy is not None:
            interval = policy.initial_interval * policy.backoff_coefficient ** (info.attempt - 1)
            if policy.maximum_interval is not None:
                interval = min(interval, policy.maximum_interval)
        if now + interval >= deadline:
            return True
    return False


def effect_of(call: Call, ticket: Ticket) -> EffectContext:
    """What the body may know of the effect it sends (``current_effect()``)."""
    return EffectContext(
        effect_id=ticket.effect_id,
        effect_type=call.effect_type,
        via=ticket.via,
        dispatch_no=ticket.dispatch_no,
        attempt=call.delivery.attempt,
        principal=call.principal,
    )


def sent_in_begin(call: Call, done: Done) -> bool:
    """Whether ``begin`` itself dispatched and committed the effect, for this attempt: a tier-0
    target's write in the journal's one transaction (not a result recorded earlier)."""
    return call.transaction is not None and done.via in SENT_NOW


def return_type_of(fn: Callable[..., Any]) -> Any:
    """What an activity declares it returns (a gated one's body, not its raw wrapper): its
    return annotation, or None when it has none (or it cannot be read)."""
    spec = spec_of(fn)
    if spec is not None:
        return spec.return_type
    try:
        return get_type_hints(fn).get("return")
    except Exception:  # a hint that does not resolve: as if there were none
        return None


@functools.lru_cache(maxsize=256)
def _result_adapter(return_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(return_type)


def result_check(return_type: Any) -> Callable[[Any], Any] | None:
    """How a result rule's MODIFY is checked against what the activity returns, as a call's
    MODIFY is against the body's parameter types: the rewrite validated (and coerced, pydantic
    lax mode) into ``return_type``, or ``ValueError`` naming what is wrong and never a value
    (``result: model_type``: ``modify(None)`` of a ``RefundResult``). The policy denies such a
    rewrite, naming the rule. None, so a rewrite passes unchecked as before, where the return
    type is unknown: no annotation, or ``Any``. A type pydantic cannot validate refuses every
    rewrite (fail closed). Cost: one ``TypeAdapter`` per return type (cached), one validation
    per rewrite."""
    if return_type is None or return_type is Any:
        return None

    def check(value: Any) -> Any:
        try:
            hash(return_type)
            build: Callable[[Any], TypeAdapter[Any]] = _result_adapter
        except TypeError:  # unhashable (an Annotated with a list in it): not cached
            build = TypeAdapter
        try:
            adapter = build(return_type)
        except Exception as err:
            problem = f"its return type cannot be validated ({type(err).__name__})"
            raise ValueError(problem) from None
        try:
            return adapter.validate_python(value)
        except Exception as err:
            raise ValueError(describe_invalid(err, "result")) from None

    return check


@functools.lru_cache(maxsize=1024)
def parameter_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    """An activity's parameter names (a gated one's as declared, not its raw wrapper's)."""
    spec = spec_of(fn)
    if spec is not None:
        return spec.param_names
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.name != "self")


def argument_names(fn: Callable[..., Any]) -> frozenset[str] | None:
    """What a policy rule may name for ``fn``: its parameters and, for a single model or
    dataclass input, that input's fields. None when they cannot be known (an untyped dict)."""
    import dataclasses
    import typing

    from pydantic import BaseModel

    spec = spec_of(fn)
    names = parameter_names(fn)
    if spec is not None:
        types: tuple[Any, ...] = spec.arg_types
    else:
        try:
            hints = get_type_hints(fn)
        except Exception:
            return None
        types = tuple(hints.get(n, Any) for n in names)
    if len(types) != 1:
        return frozenset(names)
    hint = types[0]
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return frozenset(names) | frozenset(hint.model_fields)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return frozenset(names) | frozenset(f.name for f in dataclasses.fields(hint))
    if typing.is_typeddict(hint):
        return frozenset(names) | frozenset(hint.__annotations__)
    if hint in (str, int, float, bool, bytes):
        return frozenset(names)
    return None
