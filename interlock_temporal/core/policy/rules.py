"""Rules: ``Rule = Callable[[CallEvent], Decision | None]``, composed by ``evaluate_rules``: a
deny wins, modifies compose in order (each later rule sees the rewritten call), a rule that
raises or returns a verdict the engine does not know denies (fail closed), and rules see a copy
of the call, so only a MODIFY changes what is sent."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..deprecated import warn_renamed
from .call import CallEvent
from .verdicts import Decision, Reason, Verdict

log = logging.getLogger("interlock_temporal.policy")


Rule = Callable[[CallEvent], Decision | None]


def allow() -> Decision:
    return Decision(Verdict.ALLOW)


def deny(code: str, reason: str = "", *, argument: str | None = None) -> Decision:
    """Deny the call, naming the offending argument (never its value)."""
    return Decision(Verdict.DENY, code, reason, argument=argument)


def block(code: str, reason: str = "", *, argument: str | None = None) -> Decision:
    """Deprecated: ``deny`` (the same verdict, ``DENY``), with a ``DeprecationWarning``."""
    warn_renamed("block()")
    return deny(code, reason, argument=argument)


def escalate(code: str = "RULE_ESCALATE", reason: str = "") -> Decision:
    return Decision(Verdict.ESCALATE, code, reason)


def modify(*args: Any, reason: str = "") -> Decision:
    """Rewrite the call's arguments (what is sent); identity still uses the proposed input."""
    return Decision(Verdict.MODIFY, "MODIFIED", reason, args=tuple(args))


def deny_activity(*names: str, code: str = "ACTIVITY_DENIED", reason: str = "") -> Rule:
    """Deny every call of these activities (globs)."""

    def rule(event: CallEvent) -> Decision | None:
        if any(fnmatch.fnmatchcase(event.activity, n) for n in names):
            return deny(code, reason or f"{event.activity} may not be called")
        return None

    rule.__name__ = f"deny_activity({', '.join(names)})"
    # what the rule names, for the worker's start line and `interlock doctor` (Policy.naming)
    rule.activities = names  # type: ignore[attr-defined]
    return rule


def deny_when(
    predicate: Callable[[CallEvent], bool],
    *,
    code: str = "DENIED",
    reason: str = "",
    argument: str | None = None,
) -> Rule:
    """Deny calls the predicate holds for. A predicate that raises denies too (fail closed)."""

    def rule(event: CallEvent) -> Decision | None:
        if predicate(event):
            return deny(code, reason, argument=argument)
        return None

    rule.__name__ = f"deny_when({getattr(predicate, '__name__', 'predicate')})"
    return rule


def rule_name(rule: Rule) -> str:
    return str(getattr(rule, "policy_id", None) or getattr(rule, "__name__", type(rule).__name__))


def _rule_error(reason: str, name: str | None) -> Decision:
    return Decision(Verdict.DENY, Reason.RULE_ERROR.value, reason, policy_id=name)


def _malformed(d: object) -> str | None:
    """What is wrong with a rule's return value (None: it is a decision the engine knows).
    Says which type was wrong, never a value: a rule may build its result from the input."""
    if not isinstance(d, Decision):
        return f"returned a {type(d).__name__}, not a Decision"
    # by type, not equality: a StrEnum member equals its string, so "DENY" == Verdict.DENY
    if not isinstance(d.verdict, Verdict):
        return (
            f"returned a verdict the engine does not know "
            f"(a {type(d.verdict).__name__}, not a Verdict)"
        )
    if d.verdict is Verdict.MODIFY and d.args is not None and not isinstance(d.args, tuple | list):
        return f"returned MODIFY with args that are a {type(d.args).__name__}, not a tuple"
    return None


def evaluate_rules(
    rules: Sequence[Rule],
    event: CallEvent,
    *,
    result_check: Callable[[Any], Any] | None = None,
) -> tuple[Decision, CallEvent]:
    """Run ``rules`` in order: the composed decision and the call as rewritten.

    A deny wins at once. A modify rewrites the arguments every later rule sees. An escalate
    is remembered while later rules may still deny. A rule that raises, or returns anything
    but None or a ``Decision`` with a ``Verdict``, denies (fail closed). A modify with no value
    rewrites nothing.

    ``result_check`` (the result phase only): what the activity returns, as a function that
    validates a result rule's rewrite into that type (coerced) or raises ``ValueError`` naming
    what is wrong, never a value. A rewrite it refuses denies with ``RULE_ERROR``, naming the
    rule (``modify(None)`` of a result that cannot be None); the coerced value is what later
    rules see and what is returned. None (the return type is unknown: no annotation, or
    ``Any``): a rewrite is taken as it is.

    Rules see a private copy of the call (made once per evaluation, and again of each
    rewrite), so only a MODIFY changes what is sent: an edit of the arguments in place
    reaches neither the body nor the journal.
    """
    if not rules:
        return Decision(Verdict.ALLOW), event
    result_phase = event.phase == "result"
    rewritten = event  # what would be sent (or returned): never handed to a rule
    try:
        seen = dataclasses.replace(
            event,
            args=copy.deepcopy(event.args),
            result=copy.deepcopy(event.result) if result_phase else event.result,
        )
    except Exception as err:
        log.warning("the call to %s cannot be copied for the policy rules", event.activity)
        return (
            _rule_error(f"the call cannot be copied for the rules ({type(err).__name__})", None),
            event,
        )
    escalation: Decision | None = None
    modified = False
    for rule in rules:
        name = rule_name(rule)
        try:
            d = rule(seen)
        except Exception as err:
            log.warning("policy rule %s raised %s: the call is blocked", name, type(err).__name__)
            return _rule_error(f"rule {name} raised {type(err).__name__}", name), rewritten
        if d is None:
            continue
        problem = _malformed(d)
        if problem is not None:
            log.warning("policy rule %s %s: the call is blocked", name, problem)
            return _rule_error(f"rule {name} {problem}", name), rewritten
        if d.verdict is Verdict.ALLOW:
            continue
        if d.policy_id is None:
            d = dataclasses.replace(d, policy_id=name)
        if d.verdict is Verdict.DENY:
            return d, rewritten
        if d.verdict is Verdict.MODIFY:
            if not d.args:
                log.warning("policy rule %s returned MODIFY without a value: ignored", name)
                continue
            value = d.args[0]
            if result_phase and result_check is not None:
                try:
                    value = result_check(value)
                except Exception as err:
                    reason = (
                        f"rule {name} rewrote the result of {event.activity} into one it does "
                        f"not return ({err})"
                    )
                    log.warning("policy rule %s: %s", name, reason)
                    return _rule_error(reason, name), rewritten
            try:
                if result_phase:
                    rewritten = dataclasses.replace(rewritten, result=value)
                    seen = dataclasses.replace(seen, result=copy.deepcopy(value))
                else:
                    rewritten = dataclasses.replace(rewritten, args=tuple(d.args))
                    seen = dataclasses.replace(seen, args=copy.deepcopy(tuple(d.args)))
            except Exception as err:
                reason = f"rule {name} returned a rewrite that cannot be copied"
                log.warning("policy rule %s: %s", name, reason)
                return _rule_error(f"{reason} ({type(err).__name__})", name), rewritten
            modified = True
        elif d.verdict is Verdict.ESCALATE and escalation is None:
            escalation = d
    if escalation is not None:
        return escalation, rewritten
    if modified:
        return Decision(Verdict.MODIFY, "MODIFIED", args=rewritten.args), rewritten
    return Decision(Verdict.ALLOW), rewritten
