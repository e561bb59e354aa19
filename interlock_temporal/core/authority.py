"""Signed authority: who acts, under which lease, bound to the one workflow it was made for.

``act_as`` in workflow code names a principal and a lease; that context travels to activities,
child workflows and the next run (continue-as-new) in a Temporal header. Headers are visible
in history and anyone who can start a workflow can set them, and lease ids are not secrets, so
the header is signed: HMAC-SHA256 under a key derived (HKDF-SHA256, RFC 5869, label
``interlock-authority-v1``) from the journal's signing keys, which only workers hold. The claim
names its destination, so a header copied from one workflow's history means nothing in another:

- ``activity``: (namespace, workflow id, run id) of the workflow that scheduled it;
- ``child``: (the child's workflow id, the parent's workflow id, the parent's run id);
- ``continue_as_new``: (workflow id, the chain's first execution run id).

Only the standard library signs and verifies, with no time and no randomness: workflow code
does it, and must replay.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .derived_keys import DerivedKey, DerivedKeys
from .identity import canonical_json
from .journal.signing import Keyring

LABEL = b"interlock-authority-v1"
#: the family's name, the prefix of its key ids (``authority-...``)
NAME = "authority"

#: the field of an unsigned header that carries why a workflow's inherited authority was refused
REFUSED_FIELD = "refused"


class Authority(BaseModel):
    """The trusted principal, its lease id and session, as ``act_as`` set them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal: str = Field(min_length=1)
    lease_id: str | None = None
    session: str | None = None


class ActivityBinding(BaseModel):
    """An activity (or local activity) scheduled by this run of this workflow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["activity"] = "activity"
    namespace: str
    workflow_id: str
    run_id: str

    def describe(self) -> str:
        return (
            f"an activity of workflow {self.workflow_id!r} (run {self.run_id}) "
            f"in namespace {self.namespace!r}"
        )


class ChildBinding(BaseModel):
    """A child workflow started by this run of its parent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["child"] = "child"
    workflow_id: str
    parent_workflow_id: str
    parent_run_id: str

    def describe(self) -> str:
        return (
            f"child workflow {self.workflow_id!r} of workflow {self.parent_workflow_id!r} "
            f"(run {self.parent_run_id})"
        )


class ContinueAsNewBinding(BaseModel):
    """The next run of a workflow that continued as new."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["continue_as_new"] = "continue_as_new"
    workflow_id: str
    first_execution_run_id: str

    def describe(self) -> str:
        return (
            f"the next run of workflow {self.workflow_id!r} "
            f"(first run {self.first_execution_run_id})"
        )


AnyBinding = ActivityBinding | ChildBinding | ContinueAsNewBinding
Binding = Annotated[AnyBinding, Field(discriminator="kind")]


class AuthorityClaim(BaseModel):
    """What the authority header asserts: an authority, and where it may be used. (Not a
    journal ``Claim``, which a live attempt holds on an effect.)"""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal: str = Field(min_length=1)
    lease_id: str | None = None
    session: str | None = None
    binding: Binding

    @classmethod
    def of(cls, authority: Authority, binding: AnyBinding) -> AuthorityClaim:
        return cls(
            principal=authority.principal,
            lease_id=authority.lease_id,
            session=authority.session,
            binding=binding,
        )

    @property
    def authority(self) -> Authority:
        return Authority(principal=self.principal, lease_id=self.lease_id, session=self.session)

    def signed_bytes(self) -> bytes:
        """RFC 8785 canonical JSON of the claim: what the MAC covers, whatever order or spacing
        the header's JSON arrived in."""
        return canonical_json(self.model_dump(mode="json"))


class SignedClaim(BaseModel):
    """The header's value: the claim, the id of the authority key, and the MAC (hex)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    claim: AuthorityClaim
    key_id: str
    mac: str


RejectCode = Literal[
    "unsigned", "malformed", "unknown_key", "bad_signature", "wrong_binding", "refused"
]
REJECT_CODES: frozenset[str] = frozenset(get_args(RejectCode))


class AuthorityInvalid(ValueError):
    """A header that grants nothing, and why (``code`` for machines, ``reason`` for people)."""

    def __init__(self, code: RejectCode, reason: str) -> None:
        super().__init__(reason)
        self.code: RejectCode = code
        self.reason = reason


class AuthorityKeys:
    """The key that signs new headers and the older ones that still verify them: one per key of
    the journal's keyring (``DerivedKeys`` under the label ``interlock-authority-v1``), so a
    rotated journal key rotates this too and a retired key that is kept as an older key still
    verifies the headers it signed."""

    def __init__(self, signing: DerivedKey | None, older: Iterable[DerivedKey] = ()) -> None:
        self._family = DerivedKeys(signing, older)
        self.signing = signing

    @classmethod
    def of(cls, keyring: Keyring) -> AuthorityKeys:
        family = DerivedKeys.of(keyring, LABEL, NAME)
        return cls(family.signing, [k for k in map(family.get, family.key_ids) if k is not None])

    @property
    def key_ids(self) -> list[str]:
        return self._family.key_ids

    def sign(self, authority: Authority, binding: AnyBinding) -> dict[str, Any]:
        """The header value granting ``authority`` at ``binding`` (JSON data)."""
        if self.signing is None:
            raise AuthorityInvalid(
                "unknown_key", "this worker holds no key that signs authority headers"
            )
        claim = AuthorityClaim.of(authority, binding)
        signed = SignedClaim(
            claim=claim, key_id=self.signing.key_id, mac=self.signing.mac(claim.signed_bytes())
        )
        return signed.model_dump(mode="json")

    def open(self, value: Any) -> AuthorityClaim:
        """The claim a header value carries, once its signature checks out; raises
        ``AuthorityInvalid`` saying why not. Where it may be used is checked apart
        (``for_activity``, ``for_start``)."""
        if isinstance(value, Mapping) and REFUSED_FIELD in value and "mac" not in value:
            code = value.get("code")
            raise AuthorityInvalid(
                code if code in REJECT_CODES else "refused",
                f"this workflow run's start header grants no authority: {value[REFUSED_FIELD]}",
            )
        if not isinstance(value, Mapping) or not {"mac", "key_id"} & set(value):
            raise AuthorityInvalid(
                "unsigned",
                "the authority header is not signed: only a worker's act_as makes one, so a "
                "client set it (or a release from before signed headers)",
            )
        try:
            signed = SignedClaim.model_validate(value)
        except ValidationError as err:
            fields = sorted({".".join(str(p) for p in e["loc"]) or "header" for e in err.errors()})
            raise AuthorityInvalid(
                "malformed", f"the authority header is malformed (fields: {', '.join(fields)})"
            ) from None
        key = self._family.get(signed.key_id)
        if key is None:
            raise AuthorityInvalid(
                "unknown_key",
                f"the authority header is signed with key {signed.key_id!r}, which this worker "
                "does not hold (a forgery, or a journal key retired without being kept as an "
                "older key)",
            )
        if not hmac.compare_digest(key.mac(signed.claim.signed_bytes()), signed.mac):
            raise AuthorityInvalid(
                "bad_signature",
                "the authority header's signature does not match its claim (forged or altered)",
            )
        return signed.claim


def _expect(claim: AuthorityClaim, binding: AnyBinding) -> Authority:
    if claim.binding != binding:
        raise AuthorityInvalid(
            "wrong_binding",
            f"the authority header was signed for {claim.binding.describe()}, not for "
            f"{binding.describe()}: it was copied from elsewhere",
        )
    return claim.authority


def for_activity(
    claim: AuthorityClaim, *, namespace: str | None, workflow_id: str | None, run_id: str | None
) -> Authority:
    """The authority ``claim`` grants an activity of this workflow run, or ``AuthorityInvalid``.
    An activity no workflow started (a standalone activity a client started) has none."""
    if not (namespace and workflow_id and run_id):
        raise AuthorityInvalid(
            "wrong_binding",
            f"the authority header was signed for {claim.binding.describe()}, but this activity "
            "was not started by a workflow (a client started it): it carries no authority",
        )
    b, here = claim.binding, (namespace, workflow_id, run_id)
    if isinstance(b, ActivityBinding) and (b.namespace, b.workflow_id, b.run_id) == here:
        return claim.authority
    return _expect(
        claim, ActivityBinding(namespace=namespace, workflow_id=workflow_id, run_id=run_id)
    )


def for_start(
    claim: AuthorityClaim,
    *,
    workflow_id: str,
    first_execution_run_id: str,
    parent: tuple[str, str] | None,
) -> Authority:
    """The authority ``claim`` grants a workflow run from its start header: only a parent's
    (``parent`` = its workflow id and run id) or the previous run's (continue-as-new) header
    does. A header made for an activity, or a client's, is refused."""
    binding = claim.binding
    if isinstance(binding, ChildBinding):
        if parent is None:
            raise AuthorityInvalid(
                "wrong_binding",
                f"the authority header was signed for {binding.describe()}, but workflow "
                f"{workflow_id!r} has no parent: a client started it with a copied header",
            )
        return _expect(
            claim,
            ChildBinding(
                workflow_id=workflow_id, parent_workflow_id=parent[0], parent_run_id=parent[1]
            ),
        )
    if isinstance(binding, ContinueAsNewBinding):
        return _expect(
            claim,
            ContinueAsNewBinding(
                workflow_id=workflow_id, first_execution_run_id=first_execution_run_id
            ),
        )
    raise AuthorityInvalid(
        "wrong_binding",
        f"the authority header was signed for {binding.describe()}, not for a workflow's "
        "start: it was copied from another workflow's history",
    )


def refused_header(err: AuthorityInvalid) -> dict[str, str]:
    """An unsigned header that grants nothing and carries why a workflow run has no authority,
    so its activities can say so instead of a bare "no principal"."""
    return {REFUSED_FIELD: err.reason, "code": err.code}
