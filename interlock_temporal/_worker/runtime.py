"""What one worker's gate runs on: the gate itself (opened once, shared by the workers of one
plugin), the worker's Temporal client, its review settings and the gated activities it runs.
``InterlockPlugin`` makes one ``WorkerRuntime`` per worker and gives it to that worker's
interceptor, review desk and reconciler; the plain ``InterlockInterceptor`` makes its own."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import activity

from ..core.authority import AuthorityKeys
from ..core.coverage import WorkerCoverage
from ..core.errors import JournalConfigError
from ..core.journal import Journal, KeyLike, keyring_for, open_journal, parse_journal_url
from ..core.journal.interface import database_of, redacted
from ..core.journal.opening import configured_journal
from ..core.journal.signing import Keyring
from ..core.journal_identity import journal_id_of
from ..core.policy import Policy, PolicyFollower, PolicyGuard
from ..core.protocol import Gate
from ..core.review import ReviewRules
from ..core.sealing import Values
from ..core.targets import EffectTarget, capabilities, check_declaration
from .codec import CodecSealer
from .errors import JournalMismatch
from .gated import EffectContext, GateSpec
from .journal_check import QueueJournalCheck, refusal_by_heartbeat
from .logs import (
    announce_journal,
    install_ambiguous_line,
    no_heartbeat_warning,
    unread_effect_warning,
)
from .telemetry import Telemetry

if TYPE_CHECKING:
    import temporalio.client

    from ..notify import Notifier

log = logging.getLogger("interlock_temporal")

#: the journal as ``InterlockPlugin`` and ``InterlockInterceptor`` take it: open, a URL or a
#: path, or None for ``$INTERLOCK_JOURNAL``, else ``sqlite:///interlock.db`` (as the CLI)
JournalArg = Journal | str | os.PathLike[str] | None


class WorkerSetupError(ValueError):
    """A worker cannot run the gate as configured: raised while the worker is built, never
    when an activity runs. The message says what to add."""


def unbound_message(activity_name: str) -> str:
    return (
        f"gated activity {activity_name!r} has no target: bind one on the worker, "
        f"InterlockPlugin(targets={{{activity_name!r}: your_target}}) (or "
        f"InterlockInterceptor(targets=...)), or declare it where the activity is, "
        "@gated(target=your_target)"
    )


def checked_targets(targets: Mapping[str, EffectTarget] | None) -> dict[str, EffectTarget]:
    """Targets bound by activity name, each checked as ``@gated(target=...)`` checks it."""
    bound: dict[str, EffectTarget] = {}
    for name, target in (targets or {}).items():
        if not isinstance(name, str) or not name:
            raise WorkerSetupError("targets= maps activity names (str) to targets")
        check_declaration(target)
        bound[name] = target
    return bound


class GateSource:
    """Opens the gate (the journal and the policy guard) once, on first use, and derives the
    keys that sign ``act_as`` headers from the journal's keyring. Holds the targets its
    workers bind by activity name."""

    def __init__(
        self,
        journal: JournalArg = None,
        *,
        signing_key: str | bytes | None = None,
        older_keys: Sequence[KeyLike] = (),
        on_point: Callable[[str, str], None] | None = None,
        policy: Policy | PolicyFollower | None = None,
        telemetry: Telemetry | None = None,
        targets: Mapping[str, EffectTarget] | None = None,
    ) -> None:
        if isinstance(journal, Journal):
            self._journal_arg: Journal | str = journal
            self._origin = "given"
        else:
            self._journal_arg, self._origin = configured_journal(journal)
        self._signing_key = signing_key
        self._older_keys = tuple(older_keys)
        self._on_point = on_point
        self.policy = policy
        self.telemetry = telemetry or Telemetry()
        self.targets = checked_targets(targets)
        self._gate: Gate | None = None
        #: seals the journal's values: the payload codec of the workers' client, if it has one
        self._sealer: CodecSealer | None = None
        self._authority_keys: AuthorityKeys | None = None
        self._announced = False
        install_ambiguous_line()

    def announce(self) -> None:
        """Log, once, which journal the workers use when it was not named in code."""
        if not self._announced:
            self._announced = True
            announce_journal(self.gate.journal, self._origin)

    @property
    def gate(self) -> Gate:
        if self._gate is None:
            journal = self._journal_arg
            if not isinstance(journal, Journal):
                journal = open_journal(
                    journal, signing_key=self._signing_key, older_keys=self._older_keys
                )
            # the worker's loop polls and runs workflows too: a flush on it would hold them up,
            # which cost the server more CPU per activity than the hand-off to the writer thread
            journal.loop_shared = True
            guard = (
                None
                if self.policy is None
                else PolicyGuard(self.policy, journal.policy, on_decision=self.telemetry.decided)
            )
            values = Values(journal.keyring, self._sealer)
            self._gate = Gate(journal, on_point=self._on_point, policy=guard, values=values)
            self._key_effect_ids()
        return self._gate

    def _key_effect_ids(self) -> None:
        """With a payload codec, the journal's effect ids are keyed: a plain id is the sha256
        of the decision (``{order, amount}``), which a reader of workflow ids or of the journal
        could find by trying values. Only a journal with no entries can be keyed; an older
        one keeps plain ids, and says so once."""
        gate = self._gate
        if gate is None or self._sealer is None or gate.journal.effect_ids is not None:
            return
        try:
            gate.journal.key_effect_ids(gate.values.id_scheme())
        except JournalConfigError as err:
            log.warning("interlock: effect ids stay plain sha256 with a payload codec: %s", err)

    def use_client(self, client: temporalio.client.Client | None) -> None:
        """The journal's values go through the payload codec of the workers' client (one
        codec per gate: a worker whose client has none stores values as before; a second,
        different codec is refused: the journal could not say which one a value needs)."""
        codec = None if client is None else client.data_converter.payload_codec
        if codec is None:
            return
        if self._sealer is not None:
            if self._sealer.codec is not codec:
                raise WorkerSetupError(
                    "workers of one InterlockPlugin share one journal: their clients must "
                    "share one payload codec"
                )
            return
        self._sealer = CodecSealer(codec)
        if self._gate is not None:
            self._gate.values.sealer = self._sealer
            self._key_effect_ids()

    def authority_keys(self, *, replay_only: bool = False) -> AuthorityKeys:
        """The keys that sign and verify ``act_as`` headers, derived from the journal's keyring
        (so they rotate with it). Derived once, outside any workflow: no I/O in the sandbox.
        ``replay_only``: a Replayer's, read without opening (or creating) the journal."""
        if self._authority_keys is None:
            if self._gate is None and replay_only and isinstance(self._journal_arg, str):
                return AuthorityKeys.of(self._replay_keyring(self._journal_arg))
            self._authority_keys = AuthorityKeys.of(self.gate.journal.keyring)
        return self._authority_keys

    def _replay_keyring(self, url: str) -> Keyring:
        """A Replayer runs no activity and needs no journal: the keys are read where the
        journal's would come from, creating nothing. Without them, a run's inherited authority
        does not verify (which changes nothing a replay checks, unless workflow code reads
        ``current_principal()``)."""
        where = parse_journal_url(url)
        try:
            return keyring_for(
                None if where.scheme == "postgresql" else where.path,
                self._signing_key,
                self._older_keys,
                create=False,
            )
        except JournalConfigError as err:
            log.warning("replaying without the journal's keys: %s", err)
            return Keyring(None)


#: what ``EffectTarget`` declares beyond its required part, forwarded when the target has it
_DECLARED = ("tier", "dedupe_margin", "query", "validate", "classify", "clock", "confirmation")


class DeclaredTarget:
    """A target as its protocol declares it (name, tier, windows, and the reads: ``query``,
    ``capture``, ``validate``...), and nothing else: no method that sends is reachable
    through it. The reconciler and the review desk see targets only this way."""

    def __init__(self, target: EffectTarget) -> None:
        self.name: str = target.name
        self.dedupe_window: timedelta | None = target.dedupe_window
        self.settle_time: timedelta = target.settle_time
        self.capture = target.capture
        for attr in _DECLARED:
            if hasattr(target, attr):
                setattr(self, attr, getattr(target, attr))


@dataclass(frozen=True)
class Recoverable:
    """What a worker keeps of a gated activity it runs, for closing out and checking what was
    recorded: the target as declared, how the recorded input decodes, the return type. Never
    the body: nothing kept here can send."""

    target: DeclaredTarget
    decode_args: Callable[[list[Any]], tuple[Any, ...]]
    return_type: Any

    @classmethod
    def of(cls, spec: GateSpec) -> Recoverable:
        return cls(DeclaredTarget(spec.require_target()), spec.inputs.decode_json, spec.return_type)


class WorkerRuntime:
    """One worker's: the gate (from its ``GateSource``), its client, its review settings, and
    the gated activities it runs (as ``Recoverable``, by activity name)."""

    def __init__(
        self,
        source: GateSource,
        *,
        client: temporalio.client.Client | None = None,
        review_rules: ReviewRules | None = None,
        review_task_queue: str | None = None,
        replay_only: bool = False,
        notifiers: Mapping[str, Notifier] | None = None,
        reminder_s: float | None = None,
    ) -> None:
        self.source = source
        #: the worker's client, for thread-pool activities (they have no activity.client())
        self.client = client
        if not replay_only:
            source.use_client(client)
        self.review_rules = review_rules or ReviewRules()
        #: the names of the gate's own activities (``install``): the policy does not decide them
        self.own_activities: frozenset[str] = frozenset()
        #: the user's activities, gated, policed only or neither (``install``, again at each
        #: policy reload); the worker's start line and ``interlock doctor`` say it
        self.coverage = WorkerCoverage()
        #: where reviews run (None: the task queue of the activity that opens one)
        self.review_task_queue = review_task_queue
        #: who is told when a review opens, nears its deadline, expires, escalates, ends
        self.notifiers: Mapping[str, Notifier] = notifiers or {}
        #: how often an open review is sent again (None: never)
        self.reminder_s = reminder_s
        #: a Replayer's runtime: no journal is opened (or created) for it
        self.replay_only = replay_only
        #: a retried gated attempt drops its workflow's sticky queue (``sticky``)
        self.release_sticky = True
        self._gated: dict[str, Recoverable] = {}
        self._specs: dict[str, GateSpec] = {}
        #: the activity types already warned of a missing heartbeat_timeout
        self._warned: set[str] = set()
        #: the activity types warned of for a body that never read ``current_effect()``
        self._unread: set[str] = set()
        #: one task queue, one journal: the pollers of the worker's task queue (``install``
        #: makes it; None for a worker without a client, which checks heartbeats only)
        self.queue_check: QueueJournalCheck | None = None

    @property
    def gate(self) -> Gate:
        return self.source.gate

    @property
    def telemetry(self) -> Telemetry:
        return self.source.telemetry

    @property
    def journal_id(self) -> str:
        """The journal's id (``core.journal_identity``), created by the first worker that
        needs it."""
        found = journal_id_of(self.gate.journal)
        assert found is not None  # journal_id_of creates one when there is none
        return found

    async def journal_refusal(self, info: activity.Info) -> JournalMismatch | None:
        """Why this worker must not run the gated attempt ``info`` (one task queue, one
        journal; see ``journal_check``). A worker built with ``worker_options`` (no plugin to
        start it with the worker) starts its poller check at its first gated activity."""
        check = self.queue_check
        if check is None:
            return refusal_by_heartbeat(self.journal_id, info)
        if not check.running:
            await check.start()
        return check.refusal(info)

    @property
    def authority_keys(self) -> AuthorityKeys:
        return self.source.authority_keys(replay_only=self.replay_only)

    def runs(self, activity_name: str, spec: GateSpec) -> GateSpec:
        """This worker runs the gated activity ``activity_name``: the gate it runs, with its
        target (declared by ``@gated``, or bound by activity name). ``WorkerSetupError`` when
        it has none, or both a declared one and another bound."""
        known = self._specs.get(activity_name)
        if known is not None and known.fn is spec.fn:
            return known
        bound = self.source.targets.get(activity_name)
        if spec.target is None:
            if bound is None:
                raise WorkerSetupError(unbound_message(activity_name))
            spec = spec.bound_to(bound)
        elif bound is not None and bound is not spec.target:
            raise WorkerSetupError(
                f"gated activity {activity_name!r} declares its target in "
                f"@gated(target=...) and the worker binds another under targets="
                f"{{{activity_name!r}: ...}}: keep one"
            )
        self._specs[activity_name] = spec
        if activity_name not in self._gated:
            self._gated[activity_name] = Recoverable.of(spec)
        return spec

    def check_transactional(self) -> None:
        """A tier-0 target's write commits inside the journal's transaction: refuse a worker
        whose journal is in another database, or whose tier-0 activity takes no transaction.
        Then the target makes its marker table."""
        journal = self.gate.journal
        for name, spec in self._specs.items():
            target = spec.require_target()
            if capabilities(target).tier != 0:
                continue
            if spec.transaction is None:
                raise WorkerSetupError(
                    f"gated activity {name!r}: target {target.name} is tier 0, which runs the "
                    "activity's body inside the journal's transaction, but the body takes no "
                    f"transaction: write it as def {name}(tx, ...) under "
                    "@gated(target=...) with the target declared there"
                )
            database = str(getattr(target, "database", ""))
            if database_of(database) != journal.database():
                raise WorkerSetupError(
                    f"gated activity {name!r}: target {target.name} declares tier 0 (its write "
                    f"commits in the journal's own transaction), but its database "
                    f"{redacted(database)} is not the journal's ({journal.url}): point the "
                    "target at the journal's database, or declare tier=2 (a marker table in "
                    "the target's own database)"
                )
            prepare = getattr(target, "prepare", None)
            if callable(prepare):
                prepare()

    def check_heartbeat(self, info: activity.Info) -> None:
        """Warn once per activity type when a gated activity runs with no ``heartbeat_timeout``:
        a dead worker is then found only when the attempt times out."""
        if info.heartbeat_timeout or info.activity_type in self._warned:
            return
        self._warned.add(info.activity_type)
        log.warning("%s", no_heartbeat_warning(info))

    def check_effect_read(
        self, activity_type: str, target: EffectTarget, effect: EffectContext
    ) -> None:
        """Warn once per activity type when a tier-1 or tier-2 body returned without reading
        ``current_effect()``: its effect id never reached the target, so a crash mid-send may
        send it twice (see ``unread_effect_warning``)."""
        if effect.was_read or activity_type in self._unread:
            return
        tier = capabilities(target).tier
        if tier not in (1, 2):
            return
        self._unread.add(activity_type)
        log.warning("%s", unread_effect_warning(activity_type, target.name, tier))

    def recoverable(self, activity_name: str) -> Recoverable | None:
        return self._gated.get(activity_name)

    def temporal_client(self) -> temporalio.client.Client | None:
        """The worker's client, else the running async activity's own (thread-pool activities
        have none: the worker's reference is what reaches Temporal from them)."""
        if self.client is not None:
            return self.client
        try:
            return activity.client()
        except RuntimeError:
            return None
