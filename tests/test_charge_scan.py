"""What verify's control check reads of a dispatch's bytes (``ChargeFold.scan``): by pattern in
the common shapes, by parsing the document when a pattern's key occurs in another shape (a
premise named like it); for a dispatch of format 3, whose lease is in its authorization and
whose budget note is in its dispatch part, as for the separate entries."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785

from interlock_temporal.core.journal.control_check import ChargeFold

HEAD = "7:" + "ab" * 32
LEASE = {"head": HEAD, "issued_at": 1.5, "lease_id": "lease_1", "principal": "bot"}
BUDGET = {"budget_cents": 9000, "cents": 2000, "lease_id": "lease_1", "reserved_cents": 2000}
#: a lease snapshot in a shape the pattern does not match (no ``issued_at`` after its head):
#: the document is parsed
PARSED = {"head": HEAD, "lease_id": "lease_1", "principal": "bot"}


def body(version: int, lease: dict[str, Any]) -> bytes:
    premises = {"refundable_cents": 5000}
    authorization = {"approved_digest": "cd" * 32, "lease": lease}
    dispatch = {"budget": BUDGET, "premises": premises, "via": "dispatch"}
    if version == 3:
        data: dict[str, Any] = {
            "authorization": authorization,
            "dispatch": dispatch,
            "proposal": {"premises": premises},
        }
    else:
        data = {**dispatch, "lease": lease}  # a resend's DISPATCHED: the lease and the charge
    return rfc8785.dumps(
        {"data": data, "effect_id": "e", "kind": "DISPATCHED", "prev": "", "seq": 9, "v": version}
    )


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("lease", [LEASE, PARSED], ids=["patterns", "parsed"])
def test_a_dispatch_yields_its_lease_head_and_its_charge(
    version: int, lease: dict[str, Any]
) -> None:
    charge = ChargeFold.scan(9, "e", "DISPATCHED", body(version, lease))
    assert charge is not None
    seq, effect_id, kind, signed, note = charge
    assert (seq, effect_id, kind, signed) == (9, "e", "DISPATCHED", ("lease_1", HEAD))
    assert note is not None
    assert (note["lease_id"], note["cents"], note["reserved_cents"]) == ("lease_1", 2000, 2000)
