"""Declarative policies: a YAML (or JSON) file of limits and rules, validated at load.

```yaml
policy_id: support-agents
mode: enforce                 # or monitor: record what would happen, never block
limits:
  max_repeat_calls: 3
  session_budget_usd: 5.00
  costs: {"llm_*": 0.02}
secret_arguments: [api_key]
rules:
  - id: big-refunds
    activity: refund           # a glob
    principals: ["refund-*"]   # globs; default: anyone
    when:                      # every condition must hold
      amount_cents: {gt: 5000}
    verdict: escalate          # block | escalate | allow
    reason: refunds over $50 need a person
```

Every error names the file, the line and the key. Unknown keys are refused; argument names are
checked against the activities a worker registers (``check_arguments``). The policy's epoch is a
hash of the file's content, so an approval granted under one file does not cover another.
"""

from __future__ import annotations

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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InterlockError
from ..identity import UnserializableInput, canonical_json
from .breaker import Limits
from .call import CallEvent
from .config import Policy
from .verdicts import Decision, Verdict

log = logging.getLogger("interlock_temporal.policy")

OPERATORS = ("eq", "ne", "gt", "ge", "lt", "le", "in", "not_in", "contains", "glob", "present")


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


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    activity: str = "*"
    principals: list[str] | None = None
    when: dict[str, Condition] = Field(default_factory=dict)
    verdict: Literal["block", "escalate", "allow"]
    code: str | None = None
    reason: str = ""
    #: the argument a block names (default: the first condition's)
    argument: str | None = None

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
    rules: list[RuleSpec] = Field(default_factory=list)


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
        if spec.verdict == "allow":
            return None
        argument = spec.argument or next(iter(spec.when), None)
        if spec.verdict == "block":
            code = spec.code or "POLICY_BLOCK"
            return Decision(Verdict.DENY, code, spec.reason, policy_id=spec.id, argument=argument)
        code = spec.code or "POLICY_ESCALATE"
        return Decision(Verdict.ESCALATE, code, spec.reason, policy_id=spec.id, argument=argument)


# -- loading with line numbers ------------------------------------------------------------------


class _Reader:
    """The data of a composed YAML document (as ``yaml.safe_load`` makes it), with the line of
    every key; what cannot be policy data is refused with its line and key."""

    def __init__(self, loader: yaml.SafeLoader, source: str) -> None:
        self.loader = loader
        self.source = source
        self.lines: dict[tuple[Any, ...], int] = {}

    def refused(self, line: int, path: tuple[Any, ...], what: str) -> PolicyError:
        return PolicyError(f"{self.source}:{line}: {_key_text(path)}: {what}")

    def plain(self, node: yaml.Node, path: tuple[Any, ...], above: tuple[yaml.Node, ...]) -> Any:
        line = self.lines[path] = node.start_mark.line + 1
        if any(node is n for n in above):
            raise self.refused(line, path, "an alias inside its own anchor")
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.leaf(key_node, path)
                at = key_node.start_mark.line + 1
                if not isinstance(key, str):
                    raise self.refused(at, path, f"key {key!r} is not text")
                if key in out:
                    raise PolicyError(f"{self.source}: line {at}: key {key!r} appears twice")
                out[key] = self.plain(value_node, (*path, key), (*above, node))
                self.lines[(*path, key)] = at
            return out
        if isinstance(node, yaml.SequenceNode):
            return [
                self.plain(item, (*path, i), (*above, node)) for i, item in enumerate(node.value)
            ]
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
    """The data of ``text`` and the line of every key; what is not YAML is refused, with its
    line."""
    try:
        loader = yaml.SafeLoader(text)  # checks every character first
    except yaml.reader.ReaderError as err:  # one YAML does not allow (a NUL, a control)
        row = text[: err.position].count("\n") + 1
        problem = f"character #x{err.character:04x}: {err.reason}"
        raise PolicyError(f"{source}:{row}: not valid YAML or JSON: {problem}") from None
    reader = _Reader(loader, source)
    try:
        node = loader.get_single_node()
        return ({} if node is None else reader.plain(node, (), ())), reader.lines
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at = f":{mark.line + 1}" if mark is not None else ""
        raise PolicyError(f"{source}{at}: not valid YAML or JSON: {err.problem}") from None
    finally:
        loader.dispose()


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """A ``Policy`` from YAML or JSON text; errors name ``source``, the line and the key."""
    data, lines = _read(text, source)
    if not isinstance(data, dict):
        raise PolicyError(f"{source}:1: a policy is a mapping of keys (policy_id, limits, rules)")
    try:
        doc = PolicyDoc.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors(include_url=False, include_input=False, include_context=False):
            loc = list(e["loc"])
            line = _line_of(loc, lines)
            where = f"{source}:{line}" if line else source
            what = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
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
    )


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """A ``Policy`` from a YAML or JSON file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyError(f"{p}: cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:  # a policy file is UTF-8, whatever the locale
        row = err.object[: err.start].count(b"\n") + 1
        byte = err.object[err.start]
        raise PolicyError(f"{p}:{row}: not UTF-8 text (a byte 0x{byte:02x})") from None
    return parse_policy(text, str(p))


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


class PolicySource:
    """A policy that follows its file: ``current()`` reloads it when the file changes. A file
    that no longer validates is refused (logged) and the last good policy stays, so no
    decision is ever made without one."""

    def __init__(self, path: str | os.PathLike[str], *, min_interval_s: float = 0.5) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._policy = load_policy(self.path)
        self._checked = 0.0
        self.min_interval_s = min_interval_s
        self.last_error: str | None = None
        self._on_load: list[Callable[[Policy], None]] = []

    def _stat(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def on_load(self, fn: Callable[[Policy], None]) -> None:
        """Call ``fn`` with every policy this source loads (the first one included)."""
        self._on_load.append(fn)
        fn(self._policy)

    def current(self, now: float) -> Policy:
        if now - self._checked < self.min_interval_s:
            return self._policy
        with self._lock:
            self._checked = now
            try:
                stamp = self._stat()
            except OSError as err:
                self._refuse(f"{self.path}: cannot be read: {err.strerror or err}")
                return self._policy
            if stamp == self._stamp:
                return self._policy
            self._stamp = stamp
            try:
                policy = load_policy(self.path)
                for fn in self._on_load:
                    fn(policy)
            except PolicyError as err:
                self._refuse(str(err))
                return self._policy
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
            return policy

    def _refuse(self, message: str) -> None:
        self.last_error = message
        log.error("policy file changed but is not used (the last good one stays): %s", message)
