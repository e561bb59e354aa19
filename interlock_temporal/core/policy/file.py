"""Declarative policies: a YAML (or JSON) file of limits and rules, validated at load.

```yaml
policy_id: support-agents
mode: enforce                 # or monitor: record what would happen, never block
limits:
  max_repeat_calls: 3
  session_budget_usd: 5.00
  costs: {"llm_*": 0.02}
secret_arguments: [api_key]
unknown_activities: warn      # or refuse: a rule naming no activity of the worker stops it
rules:
  - id: big-refunds
    activity: refund           # a glob
    principals: ["refund-*"]   # globs; default: anyone
    when:                      # every condition must hold
      amount_cents: {gt: 5000}
    verdict: escalate          # block | escalate | allow
    reason: refunds over $50 need a person
```

Every error names the file, the line and the key, and an unknown key or ``when`` operator the
keys (or operators) there are, with the closest as a suggestion. Argument names are checked
against the activities a worker registers (``check_arguments``), and so is each rule's
``activity`` (``check_activities``): one that matches no activity of the worker is logged as a
warning with a suggestion (a policy file may serve workers with different activities), or
refused with ``unknown_activities: refuse``. The policy's epoch is a hash of the file's content,
so an approval granted under one file does not cover another.

Whoever can edit the file must not be able to stop the worker that follows it. So a file over
``MAX_POLICY_BYTES`` is refused by its size before it is parsed; YAML anchors and aliases are
refused as the document is composed, node by node, before anything is expanded (nine aliases of
nine aliases of ... make a few hundred bytes that expand into gigabytes); nesting deeper than
``MAX_POLICY_DEPTH`` is refused at its line; and ``PolicySource`` parses a changed file on a
thread of its own, so the worker's event loop is never held by a parse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import fnmatch
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import InterlockError
from ..identity import UnserializableInput, canonical_json
from .breaker import Limits
from .call import CallEvent
from .config import FlowScope, Policy
from .flow import flow_matches
from .verdicts import Decision, Verdict

log = logging.getLogger("interlock_temporal.policy")

#: the most a policy file may weigh, 256 KiB: a real one is a few kilobytes, and this is a
#: thousand rules. A larger file is refused by its size before it is parsed. The YAML parser is
#: pure Python (so that every node has its line, and anchors are refused before they expand):
#: a file of this size takes 2-4 s of CPU to parse, on the reload's thread.
MAX_POLICY_BYTES = 256 * 1024
#: the deepest a policy file may nest (a real one nests 6 deep: rules, a rule, when, a
#: condition, ``in``, a value); deeper is refused at its line, not by Python's recursion limit
MAX_POLICY_DEPTH = 32

OPERATORS = ("eq", "ne", "gt", "ge", "lt", "le", "in", "not_in", "contains", "glob", "present")
#: what other policy languages call an operator, and its name here (for "did you mean")
_OPERATOR_SPELLINGS = {
    "equals": "eq",
    "equal": "eq",
    "==": "eq",
    "not_equal": "ne",
    "not_equals": "ne",
    "neq": "ne",
    "!=": "ne",
    "greater_than": "gt",
    ">": "gt",
    "gte": "ge",
    "greater_or_equal": "ge",
    ">=": "ge",
    "less_than": "lt",
    "<": "lt",
    "lte": "le",
    "less_or_equal": "le",
    "<=": "le",
    "one_of": "in",
    "nin": "not_in",
    "notin": "not_in",
    "not_one_of": "not_in",
    "has": "contains",
    "includes": "contains",
    "like": "glob",
    "matches": "glob",
    "match": "glob",
    "exists": "present",
}


class PolicyError(InterlockError):
    """A policy file that cannot be used: the message names the file, line and key."""


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eq: Any = None
    ne: Any = None
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    in_: list[Any] | None = Field(default=None, alias="in")
    not_in: list[Any] | None = None
    contains: Any = None
    glob: str | None = None
    present: bool | None = None

    def holds(self, value: Any, missing: bool) -> bool:
        """Every operator given holds. Comparing what cannot be compared raises (and the rule
        that asked blocks: fail closed)."""
        if self.present is not None and self.present == missing:
            return False
        if missing:
            return self.present is not None and not self.present
        checks = self.model_dump(exclude_unset=True, by_alias=False)
        for op, wanted in checks.items():
            if op == "present":
                continue
            if not _OPS[op](value, wanted):
                return False
        return True


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, w: v == w,
    "ne": lambda v, w: v != w,
    "gt": lambda v, w: v > w,
    "ge": lambda v, w: v >= w,
    "lt": lambda v, w: v < w,
    "le": lambda v, w: v <= w,
    "in_": lambda v, w: v in w,
    "not_in": lambda v, w: v not in w,
    "contains": lambda v, w: w in v,
    "glob": lambda v, w: isinstance(v, str) and fnmatch.fnmatchcase(v, w),
}


class FlowCondition(BaseModel):
    """``when: {flow: {source: ..., sink: ...}}``: an origin matching ``source`` on an argument
    under ``sink`` (each a glob or a list of them), as ``flow.flow_matches`` decides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str | list[str]
    sink: str | list[str]

    @field_validator("source", "sink")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if not value or (isinstance(value, list) and not all(value)):
            raise ValueError("give a glob, or a list of globs, none of them empty")
        return value


#: the key of ``when`` that is the flow condition, not an argument's name
FLOW_KEY = "flow"
#: where ``RuleSpec`` keeps ``when.flow`` (an error there is reported at ``when.flow``)
_FLOW_FIELD = "when_flow"


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    activity: str = "*"
    principals: list[str] | None = None
    when: dict[str, Condition] = Field(default_factory=dict)
    #: ``when.flow``, taken out of ``when`` (whose other keys name arguments)
    when_flow: FlowCondition | None = None
    verdict: Literal["block", "escalate", "allow"]
    code: str | None = None
    reason: str = ""
    #: the argument a block names (default: the first condition's)
    argument: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _flow_out_of_when(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and _FLOW_FIELD in data:
            raise ValueError(f"{_FLOW_FIELD}: unknown key; the flow condition is when.flow")
        when = data.get("when") if isinstance(data, Mapping) else None
        if isinstance(when, Mapping) and FLOW_KEY in when:
            rest = {k: v for k, v in when.items() if k != FLOW_KEY}
            return {**data, "when": rest, _FLOW_FIELD: when[FLOW_KEY]}
        return data

    @field_validator("when", mode="before")
    @classmethod
    def _bare_values_mean_eq(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: v if isinstance(v, Mapping) else {"eq": v} for k, v in value.items()}
        return value


class PolicyDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_id: str = "interlock"
    mode: str = "enforce"
    limits: Limits = Field(default_factory=Limits)
    cost_field: str | None = "cost_usd"
    secret_arguments: list[str] = Field(default_factory=list)
    #: a rule whose ``activity`` matches no activity of the worker that loads the file: a
    #: warning in its log (``warn``, the default: one file may serve workers with different
    #: activities), or the worker refuses the file (``refuse``)
    unknown_activities: Literal["warn", "refuse"] = "warn"
    #: where the flow marks of results are kept and looked up: the call's session (its
    #: workflow id unless ``act_as`` names one) or its workflow run
    flow_scope: FlowScope = "session"
    rules: list[RuleSpec] = Field(default_factory=list)


def _suggestion(given: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``given``, or ""."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_key(loc: Sequence[Any]) -> str:
    """What an unknown key at ``loc`` is, the keys there are, and the closest of them."""
    path = tuple(loc)
    if len(path) == 5 and path[0] == "rules" and path[2:4] == ("when", FLOW_KEY):
        known_flow = FlowCondition.model_fields
        hint = _suggestion(str(path[4]), known_flow)
        return f"unknown key{hint}; the keys of a flow condition are {', '.join(known_flow)}"
    if len(path) == 5 and path[0] == "rules" and path[2] == "when":
        op = str(path[4])
        near = _OPERATOR_SPELLINGS.get(op.lower())
        hint = f" (did you mean {near!r}?)" if near else _suggestion(op, OPERATORS)
        return f"unknown operator {op!r}{hint}; the operators are {', '.join(OPERATORS)}"
    known: Iterable[str] = ()
    if len(path) == 1:
        known = PolicyDoc.model_fields
    elif len(path) == 3 and path[0] == "rules":
        known = [k for k in RuleSpec.model_fields if k != _FLOW_FIELD]
        if path[-1] == FLOW_KEY:
            where = "a flow condition goes under when: when.flow"
            return f"unknown key ({where}); the keys there are {', '.join(known)}"
    elif len(path) == 2 and path[0] == "limits":
        known = Limits.model_fields
    else:
        return "unknown key"
    return f"unknown key{_suggestion(str(path[-1]), known)}; the keys there are {', '.join(known)}"


@dataclass(frozen=True)
class FileRule:
    """A declarative rule, callable as a ``Rule``."""

    spec: RuleSpec
    #: ``file:line`` of the rule, and of each condition's key
    where: str
    index: int = 0
    key_lines: Mapping[str, int] | None = None

    @property
    def policy_id(self) -> str:
        return self.spec.id

    @property
    def __name__(self) -> str:  # rule_name() and logs read it
        return self.spec.id

    @property
    def activities(self) -> tuple[str, ...]:
        """The activities the rule is for (a glob), as ``Policy.naming`` reads them."""
        return (self.spec.activity,)

    @property
    def flow_sources(self) -> tuple[str, ...]:
        """The origins its flow condition looks for (none: it has none): ``Policy`` records
        results and looks calls up only while some rule has them."""
        flow = self.spec.when_flow
        if flow is None:
            return ()
        return (flow.source,) if isinstance(flow.source, str) else tuple(flow.source)

    def __call__(self, event: CallEvent) -> Decision | None:
        spec = self.spec
        if not fnmatch.fnmatchcase(event.activity, spec.activity):
            return None
        if spec.principals is not None and not any(
            fnmatch.fnmatchcase(event.principal or "", p) for p in spec.principals
        ):
            return None
        for name, condition in spec.when.items():
            missing = object()
            value = event.argument(name, missing)
            if not condition.holds(None if value is missing else value, value is missing):
                return None
        reason, argument = spec.reason, spec.argument or next(iter(spec.when), None)
        if spec.when_flow is not None:
            found = flow_matches(event, spec.when_flow.source, spec.when_flow.sink)
            if found is None:
                return None
            argument = spec.argument or found[0]
            reason = reason or f"text from {found[1]} reached {found[0]}"
        if spec.verdict == "allow":
            return None
        if spec.verdict == "block":
            code = spec.code or "POLICY_BLOCK"
            return Decision(Verdict.DENY, code, reason, policy_id=spec.id, argument=argument)
        code = spec.code or "POLICY_ESCALATE"
        return Decision(Verdict.ESCALATE, code, reason, policy_id=spec.id, argument=argument)


# -- loading with line numbers ------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` composing one node at a time and refusing, before the node is built,
    an anchor or an alias (the only way YAML can make a small file into a large tree: a count
    after loading would come when the tree is already expanded) and nesting deeper than
    ``MAX_POLICY_DEPTH``. It costs one check per node."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        mark = event.start_mark
        line = "?" if mark is None else mark.line + 1  # the pure-Python parser marks each event
        if isinstance(event, yaml.AliasEvent):
            raise PolicyError(f"{self.source}:{line}: a YAML alias (*): {_NO_ANCHORS}")
        if getattr(event, "anchor", None) is not None:
            raise PolicyError(f"{self.source}:{line}: a YAML anchor (&): {_NO_ANCHORS}")
        if self.depth >= MAX_POLICY_DEPTH:
            raise PolicyError(
                f"{self.source}:{line}: nested deeper than {MAX_POLICY_DEPTH} levels, the most a "
                "policy file may"
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_NO_ANCHORS = "a policy file has no anchors or aliases (write the value out where it is used)"


class _Reader:
    """The data of a composed YAML document (as ``yaml.safe_load`` makes it), with the line of
    every key; what cannot be policy data is refused with its line and key."""

    def __init__(self, loader: _Loader, source: str) -> None:
        self.loader = loader
        self.source = source
        self.lines: dict[tuple[Any, ...], int] = {}

    def refused(self, line: int, path: tuple[Any, ...], what: str) -> PolicyError:
        return PolicyError(f"{self.source}:{line}: {_key_text(path)}: {what}")

    def plain(self, node: yaml.Node, path: tuple[Any, ...]) -> Any:
        """The data of ``node``: a tree, never a graph (the loader refused every alias)."""
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.leaf(key_node, path)
                at = key_node.start_mark.line + 1
                if not isinstance(key, str):
                    raise self.refused(at, path, f"key {key!r} is not text")
                if key in out:
                    raise PolicyError(f"{self.source}: line {at}: key {key!r} appears twice")
                out[key] = self.plain(value_node, (*path, key))
                self.lines[(*path, key)] = at
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.plain(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.leaf(node, path)

    def leaf(self, node: yaml.Node, path: tuple[Any, ...]) -> Any:
        """A scalar, refused if it has no JSON form (the epoch hashes the file's JSON)."""
        line = node.start_mark.line + 1
        try:
            value = self.loader.construct_object(node, deep=True)
            canonical_json(value)
        except yaml.MarkedYAMLError as err:  # a tag safe_load does not know
            raise self.refused(line, path, f"{err.problem}") from None
        except UnserializableInput as err:
            raise self.refused(line, path, str(err)) from None
        return value


def _line_of(loc: Sequence[Any], lines: Mapping[tuple[Any, ...], int]) -> int | None:
    path = tuple(loc)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())


def _key_text(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read(text: str, source: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """The data of ``text`` and the line of every key; what is not YAML, and what YAML can write
    but a policy file may not (anchors, aliases, deep nesting), is refused with its line."""
    try:
        loader = _Loader(text, source)  # checks every character first
    except yaml.reader.ReaderError as err:  # one YAML does not allow (a NUL, a control)
        row = text[: err.position].count("\n") + 1
        problem = f"character #x{err.character:04x}: {err.reason}"
        raise PolicyError(f"{source}:{row}: not valid YAML or JSON: {problem}") from None
    reader = _Reader(loader, source)
    try:
        node = loader.get_single_node()
        return ({} if node is None else reader.plain(node, ())), reader.lines
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at = f":{mark.line + 1}" if mark is not None else ""
        raise PolicyError(f"{source}{at}: not valid YAML or JSON: {err.problem}") from None
    finally:
        loader.dispose()


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """A ``Policy`` from YAML or JSON text; errors name ``source``, the line and the key. Text
    over ``MAX_POLICY_BYTES`` (in UTF-8) is refused before it is parsed."""
    if (
        len(text) > MAX_POLICY_BYTES
        or len(text.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES
    ):
        raise PolicyError(_too_large(source))
    data, lines = _read(text, source)
    if not isinstance(data, dict):
        raise PolicyError(f"{source}:1: a policy is a mapping of keys (policy_id, limits, rules)")
    try:
        doc = PolicyDoc.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors(include_url=False, include_input=False, include_context=False):
            loc = list(e["loc"])
            if len(loc) >= 3 and loc[0] == "rules" and loc[2] == _FLOW_FIELD:
                loc[2:3] = ["when", FLOW_KEY]  # where the file wrote it
            line = _line_of(loc, lines)
            where = f"{source}:{line}" if line else source
            what = _unknown_key(loc) if e["type"] == "extra_forbidden" else e["msg"]
            problems.append(f"{where}: {_key_text(loc)}: {what}")
        raise PolicyError("; ".join(problems)) from None
    ids = [r.id for r in doc.rules]
    for i, rule_id in enumerate(ids):
        if rule_id in ids[:i]:
            line = lines.get(("rules", i, "id"))
            raise PolicyError(f"{source}:{line}: rules[{i}].id: {rule_id!r} is used twice")
    epoch = hashlib.sha256(canonical_json(data)).hexdigest()[:16]
    rules = [
        FileRule(
            r,
            f"{source}:{lines.get(('rules', i), '?')}",
            i,
            {
                key: lines.get(("rules", i, "when", key)) or lines.get(("rules", i, "argument"), 0)
                for key in [*r.when, *([r.argument] if r.argument else [])]
            },
        )
        for i, r in enumerate(doc.rules)
    ]
    return Policy(
        doc.limits,
        rules,
        mode=doc.mode,
        policy_id=doc.policy_id,
        cost_field=doc.cost_field,
        secret_arguments=doc.secret_arguments,
        epoch=epoch,
        unknown_activities=doc.unknown_activities,
        flow_scope=doc.flow_scope,
    )


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """A ``Policy`` from a YAML or JSON file. At most ``MAX_POLICY_BYTES`` + 1 bytes are read: a
    larger file is refused by its size, unparsed."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except OSError as err:
        raise PolicyError(f"{p}: cannot be read: {err.strerror or err}") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(_too_large(str(p)))
    try:
        text = raw.decode("utf-8")  # a policy file is UTF-8, whatever the locale
    except UnicodeDecodeError as err:
        row = raw[: err.start].count(b"\n") + 1
        raise PolicyError(f"{p}:{row}: not UTF-8 text (a byte 0x{raw[err.start]:02x})") from None
    # the newlines ``read_text`` gave (universal newlines), so an epoch does not change
    return parse_policy(text.replace("\r\n", "\n").replace("\r", "\n"), str(p))


def _too_large(source: str) -> str:
    return f"{source}: larger than {MAX_POLICY_BYTES} bytes, the most a policy file may be"


def check_arguments(policy: Policy, activities: Mapping[str, Iterable[str] | None]) -> None:
    """Refuse rules whose conditions name an argument no matching activity has.

    ``activities`` maps each activity name to the argument names it takes (its parameters, and
    the fields of a single model or dataclass input), or None where they cannot be known (an
    untyped dict): those are not checked.
    """
    for rule in policy.rules:
        if not isinstance(rule, FileRule):
            continue
        spec = rule.spec
        named = [*spec.when, *([spec.argument] if spec.argument else [])]
        if not named:
            continue
        matched = {n: a for n, a in activities.items() if fnmatch.fnmatchcase(n, spec.activity)}
        for activity_name, known in matched.items():
            if known is None:
                continue
            known_set = set(known)
            for name in named:
                if name not in known_set:
                    source = rule.where.rsplit(":", 1)[0]
                    line = (rule.key_lines or {}).get(name) or rule.where.rsplit(":", 1)[1]
                    key = f"when.{name}" if name in spec.when else "argument"
                    raise PolicyError(
                        f"{source}:{line}: rules[{rule.index}].{key}: {activity_name} has no "
                        f"argument {name!r} (it has: {', '.join(sorted(known_set)) or 'none'})"
                    )


def check_activities(policy: Policy, activities: Iterable[str]) -> list[str]:
    """Each rule whose ``activity`` matches none of ``activities`` (the ones a worker registers)
    never fires on that worker: a typo (``send_welcom_sms``), or a rule for another worker's
    activity. Said as a warning in the log, with the closest activity as a suggestion, and
    returned; refused (``PolicyError``) when the file says ``unknown_activities: refuse``. A
    worker that registers no activity (a workflow-only worker) is not checked."""
    names = sorted(set(activities))
    if not names:
        return []
    found = []
    for rule in policy.rules:
        if not isinstance(rule, FileRule):
            continue
        pattern = rule.spec.activity
        if any(fnmatch.fnmatchcase(n, pattern) for n in names):
            continue
        source, _, line = rule.where.rpartition(":")
        found.append(
            f"{source}:{line}: rules[{rule.index}].activity: {pattern!r} (rule "
            f"{rule.spec.id!r}) names no activity of this worker"
            f"{_suggestion(pattern, names)}, so the rule never fires here; its activities are "
            f"{', '.join(names)}"
        )
    if found and policy.unknown_activities == "refuse":
        raise PolicyError("; ".join(found) + " (the file says unknown_activities: refuse)")
    for problem in found:
        log.warning(
            "%s (a policy file may serve workers with other activities; "
            "`unknown_activities: refuse` in the file refuses it instead)",
            problem,
        )
    return found


class PolicySource:
    """A policy that follows its file. A file that no longer validates is refused (logged) and
    the last good policy stays, so no decision is ever made without one.

    A file is never parsed on the caller's thread (the worker's event loop, for every call): at
    most once per ``min_interval_s`` a caller looks at the file's modification time, size and
    inode (one ``stat``), and when they changed a thread of its own reads, parses and checks the
    file (``on_load``), then puts the new policy in force, or logs why not and keeps the last
    good one. One reload runs at a time; an edit made while it runs is seen at the next look.

    ``current()`` never waits: while a reload runs it returns the last good policy.
    ``refresh()`` is ``current()`` for a coroutine: it awaits the reload in flight (the event
    loop runs on meanwhile), so the call that noticed a change, and any call arriving while it
    is parsed, is decided by the changed file, or by the last good policy if it was refused.
    The worker's interceptor awaits it before the policy decides a call. The cost: those calls
    wait for the parse (milliseconds for a real policy, a few seconds at ``MAX_POLICY_BYTES``).
    """

    def __init__(self, path: str | os.PathLike[str], *, min_interval_s: float = 0.5) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # never held while a file is read or parsed
        self._stamp = self._stat()
        self._policy = load_policy(self.path)  # at the worker's start, before its loop runs
        self._checked = 0.0
        #: the reload in flight: done when its policy is in force, or refused
        self._reloading: concurrent.futures.Future[None] | None = None
        self.min_interval_s = min_interval_s
        self.last_error: str | None = None
        self._on_load: list[Callable[[Policy], None]] = []

    def _stat(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def on_load(self, fn: Callable[[Policy], None]) -> None:
        """Call ``fn`` with every policy this source loads (the first one included); one that
        raises ``PolicyError`` refuses the policy. Called on the reload's thread."""
        self._on_load.append(fn)
        fn(self._policy)

    def current(self, now: float) -> Policy:
        """The policy in force; a reload starts on its thread when the file changed."""
        if now - self._checked < self.min_interval_s:
            return self._policy
        with self._lock:
            self._checked = now
            if self._reloading is not None:  # one at a time: the next look sees later edits
                return self._policy
            try:
                stamp = self._stat()
            except OSError as err:
                self._refuse(f"{self.path}: cannot be read: {err.strerror or err}")
                return self._policy
            if stamp == self._stamp:
                return self._policy
            self._stamp = stamp
            reloading: concurrent.futures.Future[None] = concurrent.futures.Future()
            reloading.set_running_or_notify_cancel()  # a waiter's cancellation cannot end it
            self._reloading = reloading
            name = f"interlock-policy-reload {self.path}"
            threading.Thread(target=self._reload, args=(reloading,), name=name, daemon=True).start()
            return self._policy

    async def refresh(self, now: float) -> Policy:
        """``current()``, after the reload in flight (if any, started now or before) has ended;
        awaited without holding the event loop."""
        self.current(now)
        reloading = self._reloading
        if reloading is not None:
            await asyncio.wrap_future(reloading)
        return self._policy

    def wait_reload(self, timeout: float | None = None) -> bool:
        """Block until the reload in flight, if any, has ended; False if it still runs after
        ``timeout`` seconds. For scripts and tests: a worker awaits ``refresh()`` instead."""
        reloading = self._reloading
        if reloading is None:
            return True
        try:
            reloading.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def _reload(self, reloading: concurrent.futures.Future[None]) -> None:
        """On the reload's thread: read, parse and check the file, and put it in force if it is
        good. Whatever goes wrong keeps the last good policy."""
        try:
            policy = load_policy(self.path)
            for fn in self._on_load:
                fn(policy)
        except PolicyError as err:
            with self._lock:
                self._refuse(str(err))
        except Exception as err:  # a bug must not leave the worker without a policy
            with self._lock:  # its type, not its message: that may hold a value of the file
                self._refuse(f"{self.path}: could not be reloaded: {type(err).__name__}")
        else:
            with self._lock:
                if policy.epoch != self._policy.epoch:
                    log.warning(
                        "policy %s reloaded from %s: epoch %s -> %s",
                        policy.policy_id,
                        self.path,
                        self._policy.epoch,
                        policy.epoch,
                    )
                self._policy = policy
                self.last_error = None
        finally:
            with self._lock:
                self._reloading = None
            reloading.set_result(None)

    def _refuse(self, message: str) -> None:
        self.last_error = message
        log.error("policy file changed but is not used (the last good one stays): %s", message)
