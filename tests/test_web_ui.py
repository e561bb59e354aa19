"""A person resolves an effect in doubt from the Temporal Web UI, in a real (headless) browser.

Row 13 of the fault table at tier 3: the worker is SIGKILLed after the refund landed, so the
refund is AMBIGUOUS and the support case waits for a person. The test opens the review's page in
Debian's chromium through Playwright, checks the explanation in its current details, sends an
Update the validator refuses (and sees why), then sends the signal ``resolve`` as an operator
would. The case completes and the receipt names the operator. Screenshots are saved beside the
test's files; with ``INTERLOCK_UPDATE_SCREENSHOTS=1`` they replace the operator guide's pictures
in docs/images/ (so an ordinary run leaves the checkout clean).

With an operator roster, a name alone decides nothing: the third test reads carol's one-time
code from the email the worker sent her (a real SMTP server on loopback) and pastes it into the
same form, after a wrong code that records nothing.

Needs ``/usr/bin/chromium`` and the ``playwright`` package: ``make test`` installs both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.models import Kind
from interlock_temporal.core.operators import add_operator, roster_of
from interlock_temporal.core.receipts import receipt
from interlock_temporal.core.review import review_id
from interlock_temporal.core.vote_codes import code_digest
from interlock_temporal.core.vote_proofs import ballot_of
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer, free_port
from workers.scenarios import ORDER, REFUND_CENTS
from workers.server_world import ServerWorld

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1400, "height": 1000}
#: generous: the UI polls the server, and CI machines are slow
UI_TIMEOUT_MS = 60_000
OPERATOR = "carol"
#: vote_problem's words ("for ambiguous reviews"; earlier "for a ambiguous review")
REFUSED = re.compile(r"'approve' is not a decision for (an? )?ambiguous review")


def _playwright() -> Any:
    """The browser pieces, or a failure saying how to get them (never a skip)."""
    try:
        from playwright.async_api import async_playwright, expect
    except ImportError:
        pytest.fail(
            "the Python package playwright is not installed: run `make test`, which installs "
            "it (pinned in pyproject's dev extra) and Debian's chromium"
        )
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run `make test`, which installs Debian's chromium "
            "(apt-get install -y chromium)"
        )
    return async_playwright, expect


async def _until_running(handle: WorkflowHandle[Any, Any], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            description = await handle.describe()
            if description.status == WorkflowExecutionStatus.RUNNING:
                return
        except RPCError:
            pass  # not started yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflow {handle.id} did not start within {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def _open(page: Any, url: str) -> None:
    """Load ``url``; the UI server may come up a moment after the frontend answers."""
    deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
    while True:
        try:
            await page.goto(url, wait_until="load")  # not "networkidle": the UI polls
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _full_page_screenshot(page: Any, path: Path) -> None:
    """The UI scrolls inside #content-wrapper, not the document: grow the viewport to the
    content's height for the shot, then put it back."""
    height = await page.evaluate(
        "() => Math.max(document.documentElement.scrollHeight,"
        " document.getElementById('content-wrapper')?.scrollHeight ?? 0)"
    )
    await page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height), 6000)})
    try:
        await page.screenshot(path=str(path), full_page=True)
    finally:
        await page.set_viewport_size(VIEWPORT)


@contextlib.asynccontextmanager
async def _review_page(tmp_path: Path, url: str) -> AsyncIterator[tuple[Any, Any]]:
    """Debian's chromium on a fresh profile, at a review's page, its User Metadata tab open:
    (the page, the frame of the review's current details). A failure leaves a screenshot."""
    async_playwright, _ = _playwright()
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,
        )
        page = context.pages[0] if context.pages else await context.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        try:
            await _open(page, url)
            # the current details sit under the User Metadata tab, rendered from markdown in
            # an iframe
            await page.get_by_role("tab", name="User Metadata").click()
            iframe = page.locator(
                "xpath=//h3[normalize-space()='Current Details']"
                "/ancestor::div[.//iframe][1]//iframe"
            )
            yield page, iframe
        except BaseException:
            with contextlib.suppress(Exception):  # for the person debugging, kept by pytest
                await page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            await context.close()


async def _action_dialog(page: Any, action: str, name: str, data: str) -> Any:
    """More Actions → Send a Signal / Send an Update → pick ``name`` → type ``data`` → Submit.
    Returns the dialog."""
    title = {"signal": "Send a Signal", "update": "Send an Update"}[action]
    await page.get_by_role("button", name="More Actions").click()
    await page.locator(f"[data-testid={action}-button]:visible").click()  # a hidden twin exists
    dialog = page.get_by_role("dialog").filter(has_text=title)
    await dialog.get_by_test_id(f"{action}-select-button").click()
    # an option's accessible name is the handler's name followed by its description
    await dialog.get_by_role("option", name=re.compile(rf"^{re.escape(name)}\b")).click()
    editor = dialog.locator(".cm-content[aria-label=Data]")  # CodeMirror
    await editor.click()
    await editor.fill(data)
    await editor.evaluate("e => e.blur()")  # before Submit: the dialog reflows on blur
    await dialog.get_by_role("button", name="Submit").click()
    return dialog


async def test_an_operator_resolves_an_ambiguous_refund_in_the_web_ui(tmp_path: Path) -> None:
    _, expect = _playwright()
    images = IMAGES if os.environ.get("INTERLOCK_UPDATE_SCREENSHOTS") == "1" else tmp_path
    images.mkdir(parents=True, exist_ok=True)
    server = await DevServer(ui_port=free_port()).start()
    world: ServerWorld | None = None
    try:
        assert server.ui_url is not None
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        world = await ServerWorld.create(client, tmp_path, 3, "gated")
        world.setup()

        # row 13 at tier 3: the refund lands, the worker dies before recording it, and the
        # payments service can neither dedupe a resend nor be asked: the effect is AMBIGUOUS
        world.payments.arm("after_commit", "kill")
        run = await world.start(world.case(wait_for_review=True))
        await world.crashed(run)
        await world.restart()
        (row,) = world.journal.effects()  # the refund, the world's one effect
        eid = row.effect_id
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await _until_running(review)
        assert receipt(eid, journal=world.journal).final == "AMBIGUOUS"

        async with _review_page(
            tmp_path, f"{server.ui_url}/namespaces/default/workflows/{review.id}"
        ) as (page, iframe):
            details = iframe.content_frame
            await expect(
                details.get_by_role("heading", name=re.compile("Effect in doubt"))
            ).to_be_visible(timeout=UI_TIMEOUT_MS)
            await expect(details.get_by_text(eid).first).to_be_visible()
            await expect(details.get_by_text("Known and unknown")).to_be_visible()
            await expect(details.get_by_text("Review state: open")).to_be_visible()
            # the iframe is sized to its content after it renders: wait until the last
            # line of the details fits in it before taking the picture
            await page.wait_for_function(
                """f => {
                    const d = f.contentDocument;
                    const last = d && [...d.querySelectorAll("body *")].find(
                        e => e.children.length === 0 && e.textContent.includes("Review state")
                    );
                    return !!last && last.getBoundingClientRect().bottom <= f.clientHeight;
                }""",
                arg=await iframe.element_handle(),
                timeout=UI_TIMEOUT_MS,
            )
            await _full_page_screenshot(page, images / "review-in-web-ui.png")
            assert (images / "review-in-web-ui.png").stat().st_size > 20_000

            # an Update the validator refuses: the UI shows why, and nothing is recorded
            dialog = await _action_dialog(
                page, "update", "decide", f'{{"decision": "approve", "operator": "{OPERATOR}"}}'
            )
            refusal = dialog.get_by_role("alert").filter(has_text=REFUSED)
            await expect(refusal).to_be_visible(timeout=UI_TIMEOUT_MS)
            await expect(refusal).to_contain_text("send one of happened, not_happened")
            await dialog.screenshot(path=str(images / "review-update-refused.png"))
            # the refusal is its message alone: no worker stack trace in the person's dialog
            await expect(dialog).not_to_contain_text("Traceback")
            await expect(dialog).not_to_contain_text(".py")
            await dialog.get_by_test_id("cancel-modal-button").click()
            await expect(dialog).to_be_hidden()

            status = await review.query("status")
            assert status["state"] == "open" and status["votes"] == []
            history = await review.fetch_history()
            assert not [
                e
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
            ]
            assert receipt(eid, journal=world.journal).final == "AMBIGUOUS"

            # the signal a person sends after checking the payments dashboard
            dialog = await _action_dialog(
                page,
                "signal",
                "resolve",
                f'{{"decision": "happened", "operator": "{OPERATOR}", '
                '"note": "seen in the payments dashboard"}',
            )
            await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)

        outcome = await world.result(run)
        assert outcome.status in ("RESOLVED", "REFUNDED"), outcome
        decided = await asyncio.wait_for(review.result(), 60)
        assert decided["decision"] == "happened" and decided["operators"] == [OPERATOR]

        shown = receipt(eid, journal=world.journal)
        assert shown.final == "RESOLVED"
        assert shown.executed is True
        assert shown.operator == OPERATOR
        # the Web UI's signal was found in the review's history: it carries no client identity
        assert shown.sent_by == {OPERATOR: ""}, shown.sent_by

        # the money, read from the payments service's own file: exactly one $20 refund
        with_service = SimulatedPayments(tmp_path / "payments.db", tier=3)
        try:
            records = with_service.refund_records(ORDER)
            assert [r.amount_cents for r in records] == [REFUND_CENTS]
            assert with_service.refunded_cents(ORDER) == REFUND_CENTS
        finally:
            with_service.close()
    finally:
        if world is not None:
            await world.close()
        await server.stop()


async def test_an_operator_approves_an_escalated_call_in_the_web_ui(tmp_path: Path) -> None:
    """A wire over the threshold escalates: its body never runs until a person approves it from
    the Web UI, and then runs exactly once."""
    from interlock_temporal.core.policy import Policy

    from . import test_policy_server as policies

    _, expect = _playwright()
    images = IMAGES if os.environ.get("INTERLOCK_UPDATE_SCREENSHOTS") == "1" else tmp_path
    images.mkdir(parents=True, exist_ok=True)
    server = await DevServer(ui_port=free_port()).start()
    policies.PAYEE = f"ACME-{os.getpid()}-{int(time.time())}"
    try:
        assert server.ui_url is not None
        policy = Policy(rules=[policies.over_threshold], policy_id="payments")
        async with policies.policy_rig(server, tmp_path, policy, extra_more=[policies.wire]) as r:
            case = await policies.start_approved(r, 7_500)
            review, binding = await policies.approval_review(r, 7_500)
            await asyncio.sleep(1.0)  # the body would have run by now: it must not have
            assert policies.ran(case.id) == []
            async with _review_page(
                tmp_path, f"{server.ui_url}/namespaces/default/workflows/{review.id}"
            ) as (page, iframe):
                details = iframe.content_frame
                await expect(
                    details.get_by_role("heading", name=re.compile("Approval needed"))
                ).to_be_visible(timeout=UI_TIMEOUT_MS)
                await expect(details.get_by_text("OVER_THRESHOLD").first).to_be_visible()
                await expect(details.get_by_text("7500").first).to_be_visible()
                await _full_page_screenshot(page, images / "approval-in-web-ui.png")
                dialog = await _action_dialog(
                    page,
                    "signal",
                    "resolve",
                    f'{{"decision": "approve", "operator": "{OPERATOR}", '
                    '"note": "invoice checked"}',
                )
                await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)
            assert await asyncio.wait_for(case.result(), 60) == {"ok": {"wired": 7_500}}
            assert policies.ran(case.id) == [7_500]
            decided = await asyncio.wait_for(review.result(), 60)
            assert decided["decision"] == "approve" and decided["operators"] == [OPERATOR]
            approval = r.journal.policy.approval(binding)
            assert approval is not None and approval.status == "consumed"
            assert approval.operators == [OPERATOR]
            assert approval.sent_by == {OPERATOR: ""}  # the Web UI gives no client identity
    finally:
        await server.stop()


class _Mailbox:
    """An SMTP server's handler (aiosmtpd) keeping each message as (recipients, text)."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], str, str]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes

        message = message_from_bytes(envelope.content)
        payload = message.get_payload(decode=True)
        assert isinstance(payload, bytes)
        text = payload.decode().replace("\r\n", "\n")
        self.messages.append((list(envelope.rcpt_tos), str(message["Subject"]), text))
        return "250 OK"

    def to(self, address: str) -> list[str]:
        return [text for to, _, text in self.messages if address in to]


class _NotifyingWorld(ServerWorld):
    """The row-13 world whose worker processes tell people by email (``--notify-smtp``)."""

    notify_args: list[str] = []

    def target_args(self) -> list[str]:
        return [*super().target_args(), *self.notify_args]


CODE_LINE = re.compile(r"^  happened: ([A-Z2-7]{4}(?:-[A-Z2-7]{4}){4})$", re.M)
ANY_CODE = re.compile(r"\b[A-Z2-7]{4}(?:-[A-Z2-7]{4}){4}\b")


async def test_an_operator_decides_with_her_emailed_one_time_code_in_the_web_ui(
    tmp_path: Path,
) -> None:
    """The journal has an operator roster: carol, reached at ``mailto:carol@example.org``. The
    refund is AMBIGUOUS (row 13 at tier 3, as above); the worker emails carol her one-time
    codes (a real SMTP server on loopback) and the team none. In Debian's chromium, the review's
    details say how to send a code; a wrong code sent through the Web UI's signal form records
    nothing (and counts against her); her emailed code for ``happened`` decides the review,
    recorded with a proof ``via: code``; the payments service shows one refund."""
    from aiosmtpd.controller import Controller

    _, expect = _playwright()
    started = time.monotonic()
    mailbox = _Mailbox()
    smtp_port = free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    server = await DevServer(ui_port=free_port()).start()
    world: _NotifyingWorld | None = None
    try:
        assert server.ui_url is not None
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        world = _NotifyingWorld(client, tmp_path, 3, "gated")
        world.notify_args = [
            *("--notify-smtp", f"127.0.0.1:{smtp_port}"),
            *("--notify-to", "oncall@ops.example", "--notify-ui-url", server.ui_url),
        ]
        world.setup()
        key = Ed25519Key.generate()
        add_operator(world.journal, OPERATOR, key.public_text, notify=["mailto:carol@example.org"])

        world.payments.arm("after_commit", "kill")
        run = await world.start(world.case(wait_for_review=True))
        await world.crashed(run)
        await world.restart()
        eid = world.effect_id
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await _until_running(review)
        assert receipt(eid, journal=world.journal).final == "AMBIGUOUS"

        # carol's codes, from her mailbox: never from the journal's keys in this process
        deadline = time.monotonic() + 60
        while not mailbox.to("carol@example.org") or not mailbox.to("oncall@ops.example"):
            assert time.monotonic() < deadline, f"no email for carol: {mailbox.messages}"
            await asyncio.sleep(0.1)
        (found,) = CODE_LINE.findall(mailbox.to("carol@example.org")[0])
        code = str(found)
        assert all(not ANY_CODE.search(text) for text in mailbox.to("oncall@ops.example"))
        wrong = "AAAA-BBBB-CCCC-DDDD-EEEE"
        assert code != wrong

        url = f"{server.ui_url}/namespaces/default/workflows/{review.id}"
        async with _review_page(tmp_path, url) as (page, iframe):
            details = iframe.content_frame
            await expect(details.get_by_text("Review state: open")).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            # how to send a code, where the person deciding reads
            said = details.get_by_text(re.compile("paste the one-time code sent to you"))
            await expect(said).to_be_visible()
            await expect(said.locator("code", has_text=re.compile("^resolve$"))).to_be_visible()
            shape = '{"decision": "...", "operator": "your name", "code": "..."}'
            await expect(said.locator("code", has_text=shape)).to_be_visible()

            # a wrong code: the form sends it, the worker records nothing and says why
            dialog = await _action_dialog(
                page,
                "signal",
                "resolve",
                f'{{"decision": "happened", "operator": "{OPERATOR}", "code": "{wrong}"}}',
            )
            await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)
            # the page shows a review's details as they were when it loaded: load it again
            await page.reload(wait_until="domcontentloaded")
            await page.get_by_role("tab", name="User Metadata").click()
            await expect(details.get_by_text(re.compile("not their code"))).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            status = await review.query("status")
            assert status["state"] == "open" and status["votes"] == []
            assert receipt(eid, journal=world.journal).final == "AMBIGUOUS"
            assert not [e for e in world.journal.read(eid) if e.kind is Kind.RESOLVED]
            ballot = ballot_of(world.journal, roster_of(world.journal), "ambiguous", eid)
            assert ballot is not None
            assert world.journal.code_uses.failures(ballot.episode, OPERATOR) == 1
            await _full_page_screenshot(page, tmp_path / "review-wrong-code.png")

            # her code, as the email gave it
            dialog = await _action_dialog(
                page,
                "signal",
                "resolve",
                f'{{"decision": "happened", "operator": "{OPERATOR}", "code": "{code}"}}',
            )
            await expect(dialog).to_be_hidden(timeout=UI_TIMEOUT_MS)

        outcome = await world.result(run)
        assert outcome.status in ("RESOLVED", "REFUNDED"), outcome
        decided = await asyncio.wait_for(review.result(), 60)
        assert decided["decision"] == "happened" and decided["operators"] == [OPERATOR]
        (resolved,) = [e for e in world.journal.read(eid) if e.kind is Kind.RESOLVED]
        (proof,) = resolved.data["proofs"]
        assert proof["operator"] == OPERATOR and proof["via"] == "code"
        assert proof["digest"] == code_digest(code) and code not in str(resolved.data)
        assert world.journal.code_uses.used(code_digest(code))  # spent: it works once
        assert receipt(eid, journal=world.journal).final == "RESOLVED"

        # the money, read from the payments service's own file: exactly one $20 refund
        with_service = SimulatedPayments(tmp_path / "payments.db", tier=3)
        try:
            records = with_service.refund_records(ORDER)
            assert [r.amount_cents for r in records] == [REFUND_CENTS]
        finally:
            with_service.close()
        print(f"the one-time code in the Web UI: {time.monotonic() - started:.1f} s")
    finally:
        if world is not None:
            await world.close()
        await server.stop()
        smtp.stop()
