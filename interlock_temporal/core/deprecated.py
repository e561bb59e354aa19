"""Everything kept one more release under an old name, and the release that removes it: the one
list to read (and empty) before that release.

- **Aliases** (``ALIASES``): a public name that moved to another public module. The old module's
  ``__getattr__`` (``exports.lender``) finds it there, and each use warns.
- **Renamed** (``RENAMED``): a member or function whose old name still works, with a warning:
  ``Verdict.BLOCK`` (``Verdict.DENY``) and ``policy.block()`` (``deny()``).
- **Ignored settings** (``IGNORED``): an argument or field still accepted and then ignored or
  mapped to its replacement, with a warning where it is given.
- **Signatures** (``SIGNATURES``): a target's method written for an earlier release, still
  called (adapted) with a warning when ``@gated`` (or a worker's ``targets=``) checks the
  target: ``query(self, effect_id)``, which now also takes the effect's approved input.
- **Notification formats** (``NOTIFY``): what notifiers still send or accept beside the Standard
  Webhooks form (``interlock_temporal.notify``), which warns where a secret is given.
- **Moved modules** (``MODULES``): the adapter's modules moved into ``_worker/``, ``_reviews/``
  and ``cli/`` (issue 31). Code outside the package imported some of them (``from
  interlock_temporal._review_workflow import ...``): ``MovedModules``, a finder on
  ``sys.meta_path`` installed when the package is imported, answers an old path with the new
  module itself (the same objects, private names included) and warns once per import. No file
  stays at an old path, so the package's rooms hold only what lives there; a type checker run
  over code that imports an old path no longer resolves it, and the warning says where to go.

Plain Python, imported by the core and by the package's ``__init__``; it imports nothing of the
package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: the release that removes every name below
REMOVED_IN = "0.3.0"

#: public module -> {old name: (the module it lives in now, its name there)}
ALIASES: dict[str, dict[str, tuple[str, str]]] = {
    "interlock_temporal": {
        "Change": ("interlock_temporal.targets", "Change"),
        "Found": ("interlock_temporal.targets", "Found"),
        "Limits": ("interlock_temporal.policy", "Limits"),
        "Policy": ("interlock_temporal.policy", "Policy"),
        # a person's vote: "decision" is the policy's answer on a call
        "Decision": ("interlock_temporal.review", "Vote"),
        "EffectReview": ("interlock_temporal.review", "EffectReview"),
        "Reconciler": ("interlock_temporal.review", "Reconciler"),
        "ReconcileReport": ("interlock_temporal.review", "ReconcileReport"),
        "ReconcileRequest": ("interlock_temporal.review", "ReconcileRequest"),
        "Resolution": ("interlock_temporal.review", "Resolution"),
        "ReviewStatus": ("interlock_temporal.review", "ReviewStatus"),
        "receipt_from": ("interlock_temporal.workflow", "receipt_from"),
    },
    # what a verified webhook confirmed is a report ("outcome" is how an effect's attempt ended)
    "interlock_temporal.targets.stripe": {
        "WebhookOutcome": ("interlock_temporal.targets.stripe", "WebhookReport"),
    },
    "interlock_temporal.targets": {
        "Capabilities": ("interlock_temporal.core.targets", "Capabilities"),
        "capabilities": ("interlock_temporal.core.targets", "capabilities"),
    },
    # internal since they moved: the policy's engine, not what a user configures
    "interlock_temporal.policy": {
        "ERROR_SIGNALS": ("interlock_temporal.core.policy", "ERROR_SIGNALS"),
        "Approval": ("interlock_temporal.core.policy", "Approval"),
        "CallFacts": ("interlock_temporal.core.policy", "CallFacts"),
        "Circuit": ("interlock_temporal.core.policy", "Circuit"),
        "PolicyGuard": ("interlock_temporal.core.policy", "PolicyGuard"),
        "PolicyState": ("interlock_temporal.core.policy", "PolicyState"),
        "Reason": ("interlock_temporal.core.policy", "Reason"),
        "SessionState": ("interlock_temporal.core.policy", "SessionState"),
        "admit": ("interlock_temporal.core.policy", "admit"),
        "decide": ("interlock_temporal.core.policy", "decide"),
        "evaluate_rules": ("interlock_temporal.core.policy", "evaluate_rules"),
        "has_error_signal": ("interlock_temporal.core.policy", "has_error_signal"),
        "reset_circuit": ("interlock_temporal.core.policy", "reset_circuit"),
        "PolicySource": ("interlock_temporal.core.policy.file", "PolicySource"),
        "report_cost": ("interlock_temporal", "report_cost"),
    },
}

#: old name -> (new name, what stays the same)
RENAMED: dict[str, tuple[str, str]] = {
    "Verdict.BLOCK": ("Verdict.DENY", "the same verdict"),
    "block()": ("deny()", "the same verdict, DENY"),
}

#: a setting still accepted -> what to do instead
IGNORED: dict[str, str] = {
    "CallFacts(delivery=...)": (
        "decide never reads it; the delivery goes to PolicyGuard.check, whose store records it"
    ),
}

#: a target method's signature of an earlier release, still called (adapted) -> what changed
SIGNATURES: dict[str, str] = {
    "query(self, effect_id)": (
        "query is also given the effect's approved input, as args (ignore it if the effect id "
        "is enough)"
    ),
}

#: what notifiers still send or accept beside the Standard Webhooks form -> what replaces it
NOTIFY: dict[str, str] = {
    "the Interlock-Signature header (and notify.sign())": (
        "the webhook-id, webhook-timestamp and webhook-signature headers, sent beside it"
    ),
    "a notifier secret not in the whsec_<base64> form": (
        "a secret from notify.new_secret(); meanwhile the old one's UTF-8 bytes are the key"
    ),
}

#: old module path -> the module that holds its names now
MODULES: dict[str, str] = {
    **{
        f"interlock_temporal._{name}": f"interlock_temporal._worker.{name}"
        for name in (
            "codec",
            "context",
            "errors",
            "gated",
            "install",
            "interceptor",
            "logs",
            "plugin",
            "runtime",
            "sticky",
            "telemetry",
        )
    },
    "interlock_temporal._review_workflow": "interlock_temporal._reviews.workflow",
    "interlock_temporal._review": "interlock_temporal._reviews.desk",
    "interlock_temporal._reconciler": "interlock_temporal._reviews.reconciler",
    "interlock_temporal._notifying": "interlock_temporal._reviews.notifying",
    "interlock_temporal._render": "interlock_temporal.cli._render",
}


def _warn(text: str, stacklevel: int) -> None:
    warnings.warn(f"{text}; removed in {REMOVED_IN}", DeprecationWarning, stacklevel=stacklevel + 1)


def warn_alias(module: str, name: str, stacklevel: int = 2) -> tuple[str, str]:
    """Warn that ``module.name`` is an alias; returns where the name lives now."""
    where, new_name = ALIASES[module][name]
    _warn(f"{module}.{name} is deprecated: use {where}.{new_name}", stacklevel + 1)
    return where, new_name


def warn_renamed(old: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` (a key of ``RENAMED``) was used."""
    new, same = RENAMED[old]
    _warn(f"{old} is deprecated: use {new} ({same})", stacklevel + 1)


def warn_signature(target: str, old: str, write: str) -> None:
    """Warn that ``target``'s method has the signature ``old`` (a key of ``SIGNATURES``), and
    say the line to ``write``; the warning names the first caller outside the package (the
    ``@gated`` line, or the worker's setup), so Python's default filters show it there."""
    _warn(
        f"target {target}: {old} is deprecated: {SIGNATURES[old]}; write `{write}`",
        _outside_package(),
    )


#: the package's own directory: frames there are not the user's
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _outside_package() -> int:
    """The ``stacklevel`` (for ``_warn`` called from its caller's caller) of the first frame
    outside the package."""
    frame = sys._getframe(2)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


def warn_ignored(setting: str, stacklevel: int = 2) -> None:
    """Warn that ``setting`` (a key of ``IGNORED``) was given."""
    _warn(f"{setting} is deprecated and ignored: {IGNORED[setting]}", stacklevel + 1)


class _Alias(importlib.abc.Loader):
    """Loads an old module path as the module that lives at the new one."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when it was imported at its new path."""


class MovedModules(importlib.abc.MetaPathFinder):
    """Answers an import of a moved module's old path (``MODULES``) with the module itself."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MODULES.get(fullname)
        if new is None:
            return None
        # the importer of the old path is above importlib's frames: name the moved module in
        # the message, which is what the reader needs, rather than guess the frame
        _warn(f"{fullname} moved to {new}", 2)
        return importlib.util.spec_from_loader(fullname, _Alias(importlib.import_module(new)))


def install_moved_modules() -> None:
    """Put ``MovedModules`` on ``sys.meta_path`` once (the package's ``__init__`` does)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
