"""The edits an agent asks for (write a file, apply a patch, define or replace a symbol), as the
pydantic models a gated activity takes, and what a landed edit returns."""

from __future__ import annotations

import textwrap
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ._errors import EditRejected
from ._facts import TRAILER, check_qualname, defined_name, norm_path, parse_python


def _single_definition(source: str, name: str) -> None:
    try:
        module = parse_python(textwrap.dedent(source))
    except SyntaxError as err:
        raise ValueError(f"the source of {name!r} does not parse: {err.msg}") from None
    if len(module.body) != 1 or defined_name(module.body[0]) != name:
        raise ValueError(f"the source must be exactly one definition of {name!r}")


class EditRequest(BaseModel):
    """What every edit carries: the facts it relies on beyond its own, and the premises.

    - ``reads``: files the agent relied on whole (their content hash is a premise);
    - ``relies_on``: symbols it relied on, ``"path::qualname"`` (finer: a change elsewhere in
      the file is not a change of the premise);
    - ``premises``: the facts as the agent saw them when it decided (``GitRepo.facts_for``);
      the gate re-validates them before the first send and every resend, the send once more
      against the head it commits on. Not part of the payload digest (``premises_field``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reads: list[str] = Field(default_factory=list)
    relies_on: list[str] = Field(default_factory=list)
    message: str | None = None
    premises: dict[str, Any] | None = None

    @field_validator("reads")
    @classmethod
    def _check_reads(cls, value: list[str]) -> list[str]:
        return [norm_path(p) for p in value]

    @field_validator("relies_on")
    @classmethod
    def _check_relies_on(cls, value: list[str]) -> list[str]:
        out = []
        for ref in value:
            path, sep, qual = ref.rpartition("::")
            if not sep:
                raise ValueError("relies_on entries look like 'path::qualname'")
            out.append(f"{norm_path(path)}::{check_qualname(qual)}")
        return out

    @field_validator("message")
    @classmethod
    def _check_message(cls, value: str | None) -> str | None:
        if value is not None and TRAILER.lower() in value.lower():
            raise ValueError(f"a commit message must not carry the {TRAILER} trailer itself")
        return value

    def own_facts(self) -> list[str]:
        """The facts the edit itself relies on (a replaced symbol's source, a new one's absence)."""
        return []

    def fact_keys(self) -> list[str]:
        """Every fact this edit relies on, in a stable order."""
        keys = [
            *self.own_facts(),
            *(f"file:{p}" for p in self.reads),
            *(f"symbol:{ref}" for ref in self.relies_on),
        ]
        return list(dict.fromkeys(keys))

    def subject(self) -> str:
        return "edit"


class WriteFile(EditRequest):
    """Write ``content`` to ``path`` (created if absent). Relies on the file as it was read."""

    kind: Literal["write_file"] = "write_file"
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return norm_path(value)

    def own_facts(self) -> list[str]:
        return [f"file:{self.path}"]

    def subject(self) -> str:
        return f"write {self.path}"


class ApplyPatch(EditRequest):
    """Apply a unified diff (``git apply`` semantics: the patch's context must still match)."""

    kind: Literal["apply_patch"] = "apply_patch"
    patch: str

    def subject(self) -> str:
        return "apply a patch"


class DefineSymbol(EditRequest):
    """Append a new top-level definition of ``symbol`` to ``path`` (created if absent). Relies on
    "``symbol`` does not exist yet"."""

    kind: Literal["define_symbol"] = "define_symbol"
    path: str
    symbol: str
    source: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return norm_path(value)

    @field_validator("symbol")
    @classmethod
    def _check_symbol(cls, value: str) -> str:
        if "." in check_qualname(value):
            raise ValueError("DefineSymbol defines a top-level name (no dots)")
        return value

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str, info: ValidationInfo) -> str:
        name = info.data.get("symbol")
        if isinstance(name, str):
            _single_definition(value, name)
        return value

    def own_facts(self) -> list[str]:
        return [f"symbol:{self.path}::{self.symbol}"]

    def subject(self) -> str:
        return f"define {self.symbol} in {self.path}"


class ReplaceSymbol(EditRequest):
    """Replace the definition of ``symbol`` (``name`` or ``Class.method``) in ``path`` with
    ``source``. Relies on the symbol's source as the agent read it."""

    kind: Literal["replace_symbol"] = "replace_symbol"
    path: str
    symbol: str
    source: str

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return norm_path(value)

    @field_validator("symbol")
    @classmethod
    def _check_symbol(cls, value: str) -> str:
        return check_qualname(value)

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str, info: ValidationInfo) -> str:
        name = info.data.get("symbol")
        if isinstance(name, str):
            _single_definition(value, name.rsplit(".", 1)[-1])
        return value

    def own_facts(self) -> list[str]:
        return [f"symbol:{self.path}::{self.symbol}"]

    def subject(self) -> str:
        return f"replace {self.symbol} in {self.path}"


AnyEdit = Annotated[
    WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol, Field(discriminator="kind")
]
_EDIT: TypeAdapter[WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol] = TypeAdapter(AnyEdit)
E = TypeVar("E", bound=EditRequest)


class CommitResult(BaseModel):
    """What landed: the commit, the branch it is on, its parent, the paths it changed."""

    model_config = ConfigDict(frozen=True)

    commit: str
    branch: str
    parent: str | None
    paths: list[str]
    effect_id: str
    #: how many times the send built the edit (more than 1: it was rebased onto a moved branch);
    #: None when the commit was found rather than made by this call
    attempts: int | None = None


def parse_edit(value: Any) -> WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol:
    """An edit request from a model or its JSON data (as the journal records it)."""
    if isinstance(value, WriteFile | ApplyPatch | DefineSymbol | ReplaceSymbol):
        return value
    if isinstance(value, tuple | list) and len(value) == 1:
        value = value[0]
    try:
        return _EDIT.validate_python(value)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}"
            for e in err.errors(include_url=False, include_input=False, include_context=False)
        )
        raise EditRejected(f"not an edit request: {problems}") from None
