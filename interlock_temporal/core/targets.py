"""What a target of effects can honestly promise, declared by its adapter.

Tier 1: dedupes a resend that carries the effect id as its idempotency key, inside a window.
Tier 2: can be asked whether an effect happened (``query``). Tier 3: neither. Tier 0: the
effect is a write to the journal's own database, run inside the journal's transaction
(``transact``), so no crash can leave it in doubt.
A target declares its tier (``tier = 0 | 1 | 2 | 3``) and ``gated`` checks the declaration against
what the target can do when it is applied (``check_declaration``); a duck-typed target that
declares none has its tier derived from what it can do. ``BaseTarget`` gives the optional
methods their defaults. Methods may be sync or async; the gate awaits coroutines.

A tier-1 resend is only as safe as the window is long: the resend may still be processed up to
``settle_time`` after it leaves (a request in a queue, the client library's own retries), and
clocks drift. So the gate relies on the window only until ``first dispatch + dedupe_window -
settle_time - dedupe_margin``; past that it asks the target, or says AMBIGUOUS.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from .deprecated import warn_signature
from .models import Change, Found

Classification = Literal["not_sent", "rejected", "in_doubt"]
CLASSIFICATIONS: frozenset[str] = frozenset({"not_sent", "rejected", "in_doubt"})
#: how long before a dedupe window's end (less ``settle_time``) the gate stops resending into it
DEFAULT_DEDUPE_MARGIN = timedelta(minutes=5)
#: the one signature of each method the gate calls (what a refusal tells the author to write)
QUERY_SIGNATURE = "def query(self, effect_id: str, args: Any) -> Found | None"
CAPTURE_SIGNATURE = "def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]"
VALIDATE_SIGNATURE = (
    "def validate(self, recorded: Mapping[str, Any], current: Mapping[str, Any], "
    "payload: Any) -> list[Change]"
)
CLASSIFY_SIGNATURE = (
    'def classify(self, error: BaseException) -> Literal["not_sent", "rejected", "in_doubt"]'
)
CONFIRMATION_SIGNATURE = "def confirmation(self, result: Any) -> str | None"
CLOCK_SIGNATURE = "def clock(self) -> float"
RUN_SIGNATURE = (
    "def run(self, body: Callable[..., Any], args: tuple[Any, ...], effect_id: str) -> Any"
)
TRANSACT_SIGNATURE = (
    "def transact(self, body: Callable[..., Any], db: Any, args: tuple[Any, ...], "
    "effect_id: str) -> Any"
)

T = TypeVar("T")


@runtime_checkable
class EffectTarget(Protocol):
    """The required part of a target adapter (for duck typing; ``BaseTarget`` is the class to
    subclass). Optional members:

    - ``tier: 1 | 2 | 3``: what the target promises, checked when ``gated`` is applied (without
      it the tier is derived: 1 with a dedupe window, else 2 with ``query``, else 3).
    - ``query(effect_id, args) -> Found | None``: tier 2, does the effect exist, and its result
      (``args``: the effect's approved input, for targets that look effects up through it).
    - ``validate(recorded, current, payload) -> list[Change]``: premise comparison (default:
      field-by-field equality). Prefer predicates ("refundable remainder >= amount") where
      equality is too strict.
    - ``classify(error) -> Literal["not_sent", "rejected", "in_doubt"]`` (default: in_doubt).
    - ``clock() -> float``: the clock the dedupe window is measured on (default: time.time).
    - ``dedupe_margin: timedelta``: how long before the window's end, less ``settle_time``, a
      resend stops relying on the window (default 5 minutes).
    - ``confirmation(result) -> str | None``: the target's reference for what it did (a refund
      id), cited by the receipt (default: none).
    """

    @property
    def name(self) -> str: ...

    @property
    def dedupe_window(self) -> timedelta | None: ...

    @property
    def settle_time(self) -> timedelta: ...

    def capture(
        self, args: Any, effect_id: str
    ) -> Mapping[str, Any] | Awaitable[Mapping[str, Any]]:
        """The facts the effect relies on, excluding this effect's own contribution."""
        ...


def default_validate(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """Field-by-field equality over every fact either side knows."""
    if recorded is current and all(v == v for v in current.values()):
        # the facts just captured, compared with themselves (a first attempt): no change
        # (unless one is NaN, which equals nothing: the general comparison names it)
        return []
    return [
        Change(fact=name, recorded=recorded.get(name), current=current.get(name))
        for name in sorted(set(recorded) | set(current))
        if recorded.get(name) != current.get(name)
    ]


class BaseTarget:
    """A target adapter to subclass: declare what it can promise, write ``capture`` (and
    ``query`` for tier 2), and override the rest only where the defaults do not fit.

    The gate asks a target four things about one effect: what the world looks like now (the
    premises the effect relies on), whether a send it lost track of happened, what a failed send
    means, and what the target calls what it did. It asks only what the declared tier allows.

    Declare (class attributes, or set in ``__init__``):

    - ``name: str``: recorded with every effect and shown on its receipt (``"payments"``).
    - ``tier: 1 | 2 | 3``, required, checked when ``@gated`` is applied (a declaration that does
      not match the target raises ``TargetDeclarationError`` there, naming what is missing):

      * 1, the target dedupes a resend carrying the effect id as its idempotency key inside
        ``dedupe_window`` (Stripe: 24 hours). Needs ``dedupe_window``; ``query`` is optional
        and is asked once the window can no longer be relied on.
      * 2, the target can be asked whether the effect happened. Needs ``query``, and no
        ``dedupe_window``.
      * 3, neither: an effect in doubt after a crash becomes AMBIGUOUS, for a person to decide.
        Has neither ``dedupe_window`` nor ``query``.

    - ``dedupe_window: timedelta | None`` (default None), ``settle_time: timedelta`` (default
      0: how long a request the gate handed over may still land, e.g. the client library's
      own retries; "not found" is believed only after it), ``dedupe_margin: timedelta``
      (default 5 minutes: how long before the window's end, less ``settle_time``, a resend
      stops relying on the window).

    Write:

    - ``capture(self, args, effect_id) -> Mapping[str, Any]``, required: the facts the effect
      relies on, now, as JSON data, leaving out this effect's own contribution where the target
      can tell (a refund tagged with this effect id is not a changed world).
    - ``query(self, effect_id: str, args: Any) -> Found | None``, tier 2 (optional at tier 1):
      the effect if it happened (its result and the target's reference for it), else None.
      ``args`` is the effect's approved input, for a target that looks effects up through it
      (Stripe finds a refund through its charge); ignore it if the effect id is enough. A
      ``query(self, effect_id)`` written for an earlier release is still called, with the
      effect id alone, and warned of (``DeprecationWarning``, when ``gated`` checks the target;
      refused from 0.3.0); any other ``query`` that cannot be called with both is refused.

    Override where the default is not what the target means (the defaults are what the gate
    does for a duck-typed target without the method):

    - ``classify(error)``: what a failed send means. ``"rejected"``: the target refused it
      and nothing happened (the effect is REFUSED); ``"not_sent"``: it never left (the next
      attempt sends again); ``"in_doubt"``: nobody knows (recovery finds out, by the window or
      by ``query``, or a person decides). Default: ``"in_doubt"``, the only safe guess. A
      classifier that raises or answers anything else counts as ``"in_doubt"``.
    - ``confirmation(result)``: the target's own reference for what the send did (a refund
      id), cited by the receipt. Default: None.
    - ``validate(recorded, current, payload) -> list[Change]``: the premises that no longer
      hold. Default: ``default_validate``, field-by-field equality over every fact either side
      knows. Extend it (``super().validate(...)``) with predicates ("the refundable remainder
      still covers the amount"). A validator that raises counts as a changed premise.
    - ``clock()``: the target's clock, which a tier-1 dedupe window is measured on. Default:
      ``time.time()``.

    ``capture``, ``query`` and ``validate`` may be ``async`` (the gate awaits them);
    ``classify``, ``confirmation`` and ``clock`` are called without awaiting and must be plain
    ``def``. Every method runs on the worker's event loop: one that blocks (a socket, a
    database driver) blocks the whole worker, so make it ``async`` and hand the blocking call
    to ``asyncio.to_thread`` (docs/targets.md). ``gated`` refuses a method it could not call as
    above. Subclassing is optional: any object with the same members works (``EffectTarget``
    is the protocol), and one that declares no ``tier`` has it derived from what it has.
    """

    name: str
    #: 1, 2 or 3 (see above)
    tier: int
    dedupe_window: timedelta | None = None
    settle_time: timedelta = timedelta(0)
    dedupe_margin: timedelta = DEFAULT_DEDUPE_MARGIN

    def classify(self, error: BaseException) -> Classification:
        """What a failed send means (default: nobody knows)."""
        return "in_doubt"

    def confirmation(self, result: Any) -> str | None:
        """The target's reference for what the send did (default: none)."""
        return None

    def validate(
        self, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
    ) -> list[Change]:
        """The premises that no longer hold (default: field-by-field equality)."""
        return default_validate(recorded, current)

    def clock(self) -> float:
        """The clock the dedupe window is measured on (default: this machine's)."""
        return time.time()


@dataclass(frozen=True)
class Capabilities:
    dedupe_window: timedelta | None
    queryable: bool
    settle_time: timedelta
    dedupe_margin: timedelta = DEFAULT_DEDUPE_MARGIN
    #: tier 0: the effect's write runs inside the journal's own transaction (``transact``)
    transactional: bool = False

    @property
    def tier(self) -> int:
        if self.transactional:
            return 0
        if self.dedupe_window is not None:
            return 1
        return 2 if self.queryable else 3

    def resend_deduped(self, first_dispatch_ts: float | None, now: float) -> bool:
        """Whether a resend sent at ``now`` (the target's clock) is still sure to be deduped:
        it must land, ``settle_time`` later at worst, ``dedupe_margin`` before the window that
        opened at the first dispatch closes."""
        if self.dedupe_window is None or first_dispatch_ts is None:
            return False
        usable = self.dedupe_window - self.settle_time - self.dedupe_margin
        return now < first_dispatch_ts + usable.total_seconds()


class TargetDeclarationError(ValueError):
    """A target declares what it cannot honestly promise, or lacks what the gate needs (raised
    when ``gated`` is applied). The message names the target and what is wrong, never a
    value."""


def capabilities(target: EffectTarget) -> Capabilities:
    window = getattr(target, "dedupe_window", None)
    settle = getattr(target, "settle_time", timedelta(0))
    return Capabilities(
        dedupe_window=window if window and window > timedelta(0) else None,
        queryable=callable(getattr(target, "query", None)),
        settle_time=settle,
        dedupe_margin=getattr(target, "dedupe_margin", DEFAULT_DEDUPE_MARGIN),
        transactional=getattr(target, "tier", None) == 0 and runs_transactions(target),
    )


def runs_transactions(target: object) -> bool:
    """Whether the target runs an effect's body itself, inside a database transaction it is
    handed (``transact``, tier 0) or opens (``run``, its marker tier): a body written as
    ``def body(tx, *args)``. ``SqlTarget`` (``interlock_temporal.targets.sql``) is one."""
    return callable(getattr(target, "transact", None)) and callable(getattr(target, "run", None))


def check_declaration(target: EffectTarget) -> Capabilities:
    """The target's capabilities, refused (``TargetDeclarationError``) when the target is a
    class rather than an instance, lacks what the gate needs (a ``name``, ``capture``), when
    its durations are not non-negative ``timedelta``, when its declared ``tier`` does not
    match what it can do, when a method the gate calls cannot be called the way the gate calls
    it (``query(effect_id, args)``, ``capture(args, effect_id)``, ...; see ``_CALLS``), or
    when its dedupe window is too short to rely on at all. Each of these would otherwise fail
    every attempt at run time (a ``TypeError`` Temporal retries forever) or be silently
    ignored (an ``async`` classifier's answer)."""
    if isinstance(target, type):
        raise TargetDeclarationError(
            f"target {target.__name__} is a class: pass an instance, "
            f"`target={target.__name__}(...)`"
        )
    name = _checked_name(target)
    if not callable(getattr(target, "capture", None)):
        raise TargetDeclarationError(
            f"target {name}: has no capture method; write `{CAPTURE_SIGNATURE}` (the facts the "
            "effect relies on)"
        )
    _check_durations(target, name)
    caps = capabilities(target)
    _check_tier(target, name, caps)
    for method in _CALLS:
        _check_call(target, name, method)
    margin = caps.dedupe_margin
    if caps.dedupe_window is not None and caps.dedupe_window <= caps.settle_time + margin:
        raise TargetDeclarationError(
            f"target {name}: dedupe_window must exceed settle_time + dedupe_margin "
            f"({caps.settle_time + margin}): a resend near the window's end could be processed "
            "after the target forgot its key. Lower dedupe_margin or settle_time, or declare "
            "no dedupe_window"
        )
    return caps


def _checked_name(target: object) -> str:
    name = getattr(target, "name", None)
    if not isinstance(name, str) or not name:
        raise TargetDeclarationError(
            f"target of type {type(target).__name__}: name must be a non-empty str (it is "
            "recorded with every effect)"
        )
    return name


def _check_durations(target: object, name: str) -> None:
    for attr, optional in (("dedupe_window", True), ("settle_time", False)):
        value = getattr(target, attr, None if optional else timedelta(0))
        if value is None and optional:
            continue
        if not isinstance(value, timedelta) or value < timedelta(0):
            raise TargetDeclarationError(
                f"target {name}: {attr} must be a non-negative timedelta"
                + (" or None" if optional else "")
            )
    margin = getattr(target, "dedupe_margin", DEFAULT_DEDUPE_MARGIN)
    if not isinstance(margin, timedelta) or margin < timedelta(0):
        raise TargetDeclarationError(
            f"target {name}: dedupe_margin must be a non-negative timedelta"
        )


def _check_tier(target: object, name: str, caps: Capabilities) -> None:
    """A declared tier must be what the target can do; a duck-typed target that declares none
    has its tier derived (``Capabilities.tier``), as before tiers were declared."""
    tier = getattr(target, "tier", None)
    if tier is None:
        if isinstance(target, BaseTarget):
            raise TargetDeclarationError(
                f"target {name}: declares no tier; a BaseTarget sets tier = 1, 2 or 3"
            )
        return
    if isinstance(tier, bool) or not isinstance(tier, int) or tier not in (0, 1, 2, 3):
        raise TargetDeclarationError(f"target {name}: tier must be 0, 1, 2 or 3")
    window = caps.dedupe_window is not None
    problem = None
    if tier == 0:
        problem = _tier_zero_problem(target, window, caps.queryable)
    elif tier == 1 and not window:
        problem = (
            "declares tier 1 but has no dedupe_window: declare how long it dedupes a resend "
            "by key (a positive timedelta), or declare tier 2 or 3"
        )
    elif tier > 1 and window:
        problem = (
            f"declares tier {tier} but has a dedupe_window: declare tier 1, or dedupe_window = None"
        )
    elif tier == 2 and not caps.queryable:
        problem = (
            f"declares tier 2 but has no query method: write `{QUERY_SIGNATURE}`, or declare tier 3"
        )
    elif tier == 3 and caps.queryable:
        problem = (
            "declares tier 3 but has a query method, which the gate would ask: declare tier 2, "
            "or remove query"
        )
    if problem is not None:
        raise TargetDeclarationError(f"target {name}: {problem}")


def _tier_zero_problem(target: object, window: bool, queryable: bool) -> str | None:
    """Tier 0 promises that no crash leaves the effect in doubt: only a target that runs its
    write inside the journal's own transaction can keep that (``SqlTarget``)."""
    needs = (
        (callable(getattr(target, "transact", None)), f"`{TRANSACT_SIGNATURE}`"),
        (callable(getattr(target, "run", None)), f"`{RUN_SIGNATURE}`"),
        (isinstance(getattr(target, "database", None), str), "`database: str`"),
        (queryable, f"`{QUERY_SIGNATURE}`"),
    )
    missing = [what for ok, what in needs if not ok]
    if missing:
        return (
            "declares tier 0 but cannot run its write inside the journal's transaction: it "
            f"lacks {', '.join(missing)}. Use SqlTarget (interlock_temporal.targets.sql) on the "
            "journal's database, or declare tier 1, 2 or 3"
        )
    if window:
        return "declares tier 0 but has a dedupe_window: declare dedupe_window = None"
    return None


@dataclass(frozen=True)
class _Call:
    """How the gate calls one of a target's methods."""

    #: what it passes, in order (stand-ins for the signature check)
    args: tuple[Any, ...]
    #: the same, in words
    takes: str
    signature: str
    #: the gate awaits what it returns (else an ``async def`` would hand it a coroutine)
    awaited: bool
    #: added to a refusal of its arguments
    hint: str = ""


_CALLS: dict[str, _Call] = {
    "capture": _Call(
        ("args", "effect_id"), "the activity's input and the effect id", CAPTURE_SIGNATURE, True
    ),
    "query": _Call(
        ("effect_id", None),
        "the effect id and the effect's approved input",
        QUERY_SIGNATURE,
        True,
        " (ignore args if the effect id is enough)",
    ),
    "validate": _Call(
        ({}, {}, None),
        "the recorded facts, the current facts and the effect's approved input",
        VALIDATE_SIGNATURE,
        True,
        ", or remove it (the default compares the facts field by field)",
    ),
    "classify": _Call((None,), "the error the send raised", CLASSIFY_SIGNATURE, False),
    "confirmation": _Call((None,), "the send's result", CONFIRMATION_SIGNATURE, False),
    "clock": _Call((), "no argument", CLOCK_SIGNATURE, False),
    "transact": _Call(
        (None, None, (), "effect_id"),
        "the body, the journal's connection, the approved arguments and the effect id",
        TRANSACT_SIGNATURE,
        False,
    ),
    "run": _Call(
        (None, (), "effect_id"),
        "the body, the approved arguments and the effect id",
        RUN_SIGNATURE,
        False,
    ),
}


def _check_call(target: object, name: str, method: str) -> None:
    """A method the target has must be callable the way the gate calls it (``_CALLS``). A
    signature Python cannot read (a builtin such as ``time.time``) is trusted, but for
    ``query``, whose one signature is checked strictly."""
    fn = getattr(target, method, None)
    if not callable(fn):
        return  # capture and query are checked above; the others have defaults
    call = _CALLS[method]
    if not call.awaited and inspect.iscoroutinefunction(fn):
        raise TargetDeclarationError(
            f"target {name}: {method} must be a plain def, not async def: the gate calls it "
            f"without awaiting; write `{call.signature}`"
        )
    try:
        inspect.signature(fn).bind(*call.args)
    except ValueError:
        if method != "query":
            return
    except TypeError:
        if method == "query" and not _takes_args(fn):
            # the one-argument form of an earlier release: called with the effect id alone
            warn_signature(name, "query(self, effect_id)", QUERY_SIGNATURE)
            return
    else:
        return
    raise TargetDeclarationError(
        f"target {name}: {method} must take {call.takes}; write `{call.signature}`{call.hint}"
    ) from None


#: what a target's method returns when it is not a coroutine (no ``isawaitable``, whose
#: abstract-class check costs more than the rest of a capture)
_PLAIN_RESULTS = frozenset({dict, list, tuple, type(None)})


async def resolve(value: T | Any) -> T:
    if type(value) in _PLAIN_RESULTS:
        return value  # type: ignore[no-any-return]
    return await value if inspect.isawaitable(value) else value  # type: ignore[no-any-return]


def _takes_args(fn: Any) -> bool:
    """Whether a target's ``query`` is called ``query(effect_id, args)``, as written now: False
    only for the one-argument form of an earlier release (``query(effect_id)``, deprecated),
    which cannot be called with both and can with the effect id alone."""
    try:
        signature = inspect.signature(fn)
        signature.bind("effect_id", None)
    except ValueError:
        return True  # no signature to read: called as written now
    except TypeError:
        try:
            signature.bind("effect_id")
        except TypeError:
            return True  # neither form: refused by check_declaration
        return False
    return True


async def query(target: EffectTarget, effect_id: str, args: Any) -> Found | None:
    """Ask a queryable target whether the effect happened: ``query(effect_id, args)``, with
    the effect's approved input (Stripe finds refunds through their charge); a ``query`` of
    the one-argument form of an earlier release (deprecated) with the effect id alone."""
    fn = getattr(target, "query", None)
    if not callable(fn):
        return None
    found = await resolve(fn(effect_id, args) if _takes_args(fn) else fn(effect_id))
    if found is None or isinstance(found, Found):
        return found
    return Found.model_validate(found)


#: the defaults of the optional methods, for a duck-typed target that lacks one
_DEFAULTS = BaseTarget()


def classify(target: EffectTarget, error: BaseException) -> Classification:
    fn = getattr(target, "classify", None)
    if not callable(fn):
        return _DEFAULTS.classify(error)
    try:
        verdict = fn(error)
    except Exception:
        return "in_doubt"
    return verdict if verdict in CLASSIFICATIONS else "in_doubt"


def confirmation_of(target: EffectTarget, result: Any) -> str | None:
    """The target's own reference for what it did (a refund id), if it names one."""
    fn = getattr(target, "confirmation", None)
    if not callable(fn):
        return _DEFAULTS.confirmation(result)
    try:
        value = fn(result)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def target_clock(target: EffectTarget) -> float:
    fn = getattr(target, "clock", None)
    return float(fn()) if callable(fn) else _DEFAULTS.clock()
