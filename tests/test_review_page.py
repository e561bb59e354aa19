"""What a person sees of a review: the page (the review's current details in the Web UI) says
in words what a lease does not limit, never ``None`` or ``null``; the ``status`` query answers
``[]`` for its empty lists."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import EffectReview, ReviewRequest
from interlock_temporal.core.models import Kind
from interlock_temporal.core.receipts import EffectView
from interlock_temporal.core.review import ReviewRules, review_markdown
from interlock_temporal.testing import DevServer

from .sealed import sealed


def view(**authority: Any) -> EffectView:
    lease = {
        "lease_id": "lease_1",
        "principal": "refund-bot",
        "activities": None,
        "max_amount_cents": None,
        "resources": None,
        "budget_cents": None,
        **authority,
    }
    return EffectView(
        effect_id="e" * 64,
        status=Kind.AMBIGUOUS,
        activity="refund",
        principal="refund-bot",
        lease_id="lease_1",
        target="payments",
        tier=3,
        authority=lease,
    )


def authority_line(page: str) -> str:
    lines = page.splitlines()
    return lines[lines.index("### Authority at the send") + 2]


def test_the_facts_are_a_list_a_narrow_pane_shows_and_the_json_to_send_is_short() -> None:
    """The Web UI draws a markdown table without cell padding (its headers ran together) and
    cuts a long code line at the pane's edge (the JSON to send was cut): the facts are a list,
    the JSON one short line a field."""
    facts = view()
    facts.premises = {"refunded_cents": 0, "eligible": True}
    changes = [
        {"fact": "refunded_cents", "recorded": 0, "current": 2000},
        {"fact": "disputed", "recorded": False, "current": True},
    ]
    page = review_markdown("ambiguous", facts, {"amount_cents": 2000}, ReviewRules(), changes)
    lines = page.splitlines()
    start = lines.index("### The facts it relied on") + 2
    assert lines[start : start + 3] == [
        "- **`disputed`: `false` when proposed, `true` at the last check (changed)**",
        "- `eligible`: `true` when proposed, `true` at the last check",
        "- **`refunded_cents`: `0` when proposed, `2000` at the last check (changed)**",
    ]
    assert not any(line.startswith("|") for line in lines)
    decide = lines[lines.index("### Decide") :]
    code = [line for line in decide if line.startswith("    ")]
    sent = ["".join(code[i : i + 3]).replace("     ", " ") for i in range(0, len(code), 3)]
    assert [json.loads(text)["decision"] for text in sent] == ["happened", "not_happened"]
    assert max(len(line) for line in code) <= 40


def test_a_lease_without_limits_reads_as_words() -> None:
    page = review_markdown("ambiguous", view(), {"amount_cents": 2000}, ReviewRules())
    assert authority_line(page) == (
        "lease `lease_1` held by `refund-bot`: any activity, no maximum per effect, any resource"
    )
    assert "None" not in page and "null" not in page


def test_a_lease_with_limits_names_them() -> None:
    page = review_markdown(
        "ambiguous",
        view(
            activities=["refund"],
            max_amount_cents=5000,
            resources=["order:881"],
            budget_cents=9000,
        ),
        {"amount_cents": 2000},
        ReviewRules(),
    )
    assert authority_line(page) == (
        'lease `lease_1` held by `refund-bot`: activities `["refund"]`, at most 5000 cents per '
        'effect, resources `["order:881"]`, a budget of 9000 cents'
    )


def test_an_effect_with_no_lease_says_so() -> None:
    page = review_markdown(
        "ambiguous",
        EffectView(effect_id="e" * 64, status=Kind.AMBIGUOUS, activity="refund"),
        {},
        ReviewRules(),
    )
    assert authority_line(page) == "no lease was recorded for this effect"
    assert "- principal: `-` under lease `-`" in page
    assert "None" not in page


@pytest.mark.server
async def test_the_status_query_answers_empty_lists_not_null(
    dev_server: DevServer, tmp_path: Path
) -> None:
    client = await Client.connect(
        dev_server.target,
        plugins=[InterlockPlugin(f"sqlite:///{tmp_path / 'journal.db'}", signing_key="11" * 32)],
    )
    queue = f"page-{uuid.uuid4().hex[:8]}"
    effect_id = uuid.uuid4().hex * 2
    review = f"interlock-review-ambiguous-{effect_id}"
    request = ReviewRequest(kind="ambiguous", effect_id=effect_id, activity="refund")
    async with Worker(client, task_queue=queue):
        handle = await client.start_workflow(
            EffectReview.run,
            sealed(request, review, "11" * 32),
            id=review,
            task_queue=queue,
        )
        raw: dict[str, Any] = await handle.query("status")
        await handle.terminate()
    assert {key: raw[key] for key in ("operators", "votes", "reported")} == {
        "operators": [],
        "votes": [],
        "reported": [],
    }
    assert raw["state"] == "open" and raw["subscribers"] == 0
    assert "null" not in json.dumps({k: v for k, v in raw.items() if isinstance(v, list)})
