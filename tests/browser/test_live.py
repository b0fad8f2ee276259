"""The live panel: unconfirmed deltas, dropped failed attempts, commits, reconnection.

Deltas are sent through the Redis channel layer exactly as a worker sends them
(runtime.live's message shapes), so each case is deterministic.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from runtime import operations
from runtime.live import run_group
from tests.browser.conftest import off_loop, send_live
from tests.console.support import RunDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def delta(run_id: str, step: int, attempt: int, text: str = "", **extra) -> dict:
    return {
        "type": "run.delta",
        "run_id": run_id,
        "step": step,
        "attempt": attempt,
        "claim": extra.pop("claim", 1),
        "kind": extra.pop("kind", "text"),
        "text": text,
        "index": extra.pop("index", 0),
        "name": extra.pop("name", None),
        "call_id": extra.pop("call_id", None),
        "offset": extra.pop("offset", None),
    }


def test_deltas_stream_unconfirmed_and_failed_attempts_are_dropped(stack, page, sign_in):
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    group = run_group(run_id)
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    expect(page.locator("#live [data-live-status]")).to_have_text("Live: connected.")
    live = page.locator("#live-text")

    send_live(group, delta(run_id, 1, 1, "Hello wor"))
    send_live(group, delta(run_id, 1, 1, "ld <script>alert(1)</script>"))
    expect(live).to_have_text("Hello world <script>alert(1)</script>")  # text, not markup
    assert page.locator("#live script").count() == 0
    expect(page.locator("#live-step")).to_contain_text("Step 1, attempt 1 (unconfirmed)")

    # attempt 2 of the same step: attempt 1 failed, so its text is dropped
    send_live(group, delta(run_id, 1, 2, "Fresh start"))
    expect(live).to_have_text("Fresh start")
    expect(page.locator("#live-step")).to_contain_text("Attempt 1 failed; its text was dropped")
    send_live(group, delta(run_id, 1, 1, " stale"))  # a late delta of the failed attempt
    send_live(group, delta(run_id, 1, 2, " again"))
    expect(live).to_have_text("Fresh start again")

    # tool-call argument deltas stream by index
    send_live(group, delta(run_id, 1, 2, kind="tool_call", name="ledger_once", call_id="c1"))
    send_live(group, delta(run_id, 1, 2, '{"key": ', kind="tool_call"))
    send_live(group, delta(run_id, 1, 2, '"payment-7"}', kind="tool_call"))
    tools = page.locator("#live-tools")
    expect(tools).to_contain_text("#0 ledger_once")
    expect(tools).to_contain_text('{"key": "payment-7"}')
    page.screenshot(path=str(stack_shot("live-streaming")), full_page=True)

    # a new commit's notice clears the live text and refreshes the committed panels
    off_loop(lambda: RunDriver(run_id).text_step("Fresh start again"))
    version = off_loop(lambda: RunDriver(run_id).view.version)
    send_live(group, commit_notice(run_id, version))
    expect(live).to_be_hidden()
    expect(tools).to_be_empty()
    expect(page.locator("#live-step")).to_contain_text(f"Commit #{version} landed")


def test_reconnect_shows_committed_state_first(stack, page, sign_in):
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    page.evaluate("window.__notReloaded = true")
    status = page.locator("#live [data-live-status]")
    expect(status).to_have_text("Live: connected.")
    send_live(run_group(run_id), delta(run_id, 1, 1, "half a sentence"))
    expect(page.locator("#live-text")).to_have_text("half a sentence")

    # the server goes away; meanwhile a worker commits (nobody is told)
    stack.server.terminate()
    stack.server.wait(timeout=10)
    # The socket's close says "Disconnected"; the probe that follows may already say the
    # server cannot be reached: either tells the operator that the page is not live.
    expect(status).to_contain_text(re.compile("Disconnected|cannot be reached"))
    driver = RunDriver(run_id)
    off_loop(
        lambda: driver.open_batch(
            {"name": "ledger_approval", "arguments": {"key": "k"}, "permission": "ask"},
            text="half a sentence, finished",
        )
    )
    stack.restart_server()

    # on reconnect: the committed state is fetched, the stale live text is gone
    expect(status).to_have_text("Live: connected.", timeout=20_000)
    expect(page.locator("#committed")).to_contain_text("open batch")
    expect(page.locator("#committed .messages")).to_contain_text("half a sentence, finished")
    expect(page.locator("#live-text")).to_be_hidden()
    assert page.evaluate("window.__notReloaded") is True
    # nothing was sent by the operator, so nothing claims an action was lost
    expect(page.locator("#flash")).not_to_contain_text("not sent")


def open_run_page(stack, page, sign_in) -> tuple[str, str]:
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    expect(page.locator("#live [data-live-status]")).to_have_text("Live: connected.")
    return run_id, run_group(run_id)


def commit_notice(run_id: str, seq: int) -> dict:
    return {
        "type": "run.commit",
        "run_id": run_id,
        "thread_id": "t",
        "seq": seq,
        "state": "running",
    }


def test_a_repeated_commit_notice_does_not_reset_the_stream(stack, page, sign_in):
    run_id, group = open_run_page(stack, page, sign_in)
    version = off_loop(lambda: RunDriver(run_id).view.version)
    send_live(group, delta(run_id, 1, 1, "The opening words, "))
    send_live(group, delta(run_id, 1, 1, kind="tool_call", name="ledger_once", call_id="c1"))
    send_live(group, delta(run_id, 1, 1, '{"key": "p-1", ', kind="tool_call"))
    # The log watcher's late notice of a commit the page already shows: no reset.
    send_live(group, commit_notice(run_id, version))
    send_live(group, delta(run_id, 1, 1, "then the rest."))
    send_live(group, delta(run_id, 1, 1, '"rounds": 3}', kind="tool_call"))
    live = page.locator("#live-text")
    expect(live).to_have_text("The opening words, then the rest.")
    tools = page.locator("#live-tools")
    expect(tools).to_contain_text("#0 ledger_once")
    expect(tools).to_contain_text('{"key": "p-1", "rounds": 3}')
    expect(page.locator("#live-step")).not_to_contain_text("Commit #")


def test_a_commit_announced_while_the_last_refresh_is_in_flight_is_shown(stack, page, sign_in):
    # The refresh for commit 1 is still on its way when commit 2 is announced; its answer
    # (commit 1's state) replaces the committed panel. A refresh asked for meanwhile must
    # still be made, or the page shows commit 1 for good: htmx drops a request it queued for
    # an element that the answer in flight has replaced.
    run_id, group = open_run_page(stack, page, sign_in)
    url = f"{stack.base_url}/runs/{run_id}/"
    held: list = []

    def hold(route) -> None:
        if held or route.request.headers.get("hx-request") != "true":
            route.continue_()
            return
        held.append((route, route.fetch()))  # answered now, delivered when the test says

    page.route(url, hold)
    off_loop(lambda: RunDriver(run_id).text_step("The first answer."))
    send_live(group, commit_notice(run_id, off_loop(lambda: RunDriver(run_id).view.version)))
    while not held:
        page.wait_for_timeout(50)
    off_loop(lambda: RunDriver(run_id).text_step("The second answer."))
    second = off_loop(lambda: RunDriver(run_id).view.version)
    send_live(group, commit_notice(run_id, second))
    expect(page.locator("#live-step")).to_contain_text(f"Commit #{second} landed")
    route, answer = held[0]
    route.fulfill(response=answer)
    committed = page.locator("#committed")
    expect(committed).to_contain_text("The second answer.")
    expect(committed).to_have_attribute("data-version", str(second))


def test_stream_interrupted_then_a_new_claim_starts_afresh(stack, page, sign_in):
    run_id, group = open_run_page(stack, page, sign_in)
    send_live(group, delta(run_id, 1, 1, "The dead worker's half sentence", claim=1))
    live = page.locator("#live-text")
    expect(live).to_have_text("The dead worker's half sentence")
    # no more deltas: the panel says so instead of looking alive
    expect(page.locator("#live-step")).to_contain_text("Stream interrupted", timeout=20_000)
    # another worker claims the run and streams the same step and attempt again
    send_live(group, delta(run_id, 1, 1, "A fresh start", claim=2))
    expect(live).to_have_text("A fresh start")
    expect(page.locator("#live-step")).to_contain_text("Another worker took over")
    expect(page.locator("#live-step")).not_to_contain_text("interrupted")


def test_the_live_text_follows_its_tail_unless_scrolled_up(stack, page, sign_in):
    run_id, group = open_run_page(stack, page, sign_in)
    live = page.locator("#live-text")
    for i in range(60):
        send_live(group, delta(run_id, 1, 1, f"line {i}\n"))
    expect(live).to_contain_text("line 59")
    at_bottom = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 8"
    assert live.evaluate("el => el.scrollHeight > el.clientHeight")  # it overflows
    assert live.evaluate(at_bottom)
    live.evaluate("el => { el.scrollTop = 0; }")
    send_live(group, delta(run_id, 1, 1, "line 60\n"))
    expect(live).to_contain_text("line 60")
    assert live.evaluate("el => el.scrollTop") == 0  # the operator reads on undisturbed
    live.evaluate("el => { el.scrollTop = el.scrollHeight; }")
    send_live(group, delta(run_id, 1, 1, "line 61\n"))
    expect(live).to_contain_text("line 61")
    assert live.evaluate(at_bottom)


def test_an_ended_run_does_not_say_connected(stack, page, sign_in):
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    off_loop(lambda: RunDriver(run_id).text_step("All done.", end=True))
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    status = page.locator("#live [data-live-status]")
    expect(status).to_have_text("The run has ended: nothing more will stream.")
    expect(page.locator("#committed")).to_contain_text("All done.")


def stack_shot(name: str):
    from tests.browser.conftest import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.png"


def test_a_viewer_joining_from_the_checkpoint_never_sees_words_twice(stack, page, sign_in):
    """Defect 4: "w005 w006 w007 w006 w007 w008" for a viewer who joined as the stream
    started, "w005 w00005 w006" during a kill: the checkpoint and the deltas overlapped."""
    from runtime.models import StreamCheckpoint

    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    text = "w001 w002 w003 w004 w005 w006 w007 "
    off_loop(StreamCheckpoint.objects.create, run_id=run_id, step=1, attempt=1, claim=1, text=text)
    group = run_group(run_id)
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    live = page.locator("#live-text")
    expect(live).to_have_text(text)
    # Deltas published before the viewer's subscription was read arrive after the hello:
    # those the checkpoint holds are skipped, a piece that straddles its end is cut.
    send_live(group, delta(run_id, 1, 1, "w006 ", offset=25))
    send_live(group, delta(run_id, 1, 1, "w007 w008 ", offset=30))
    send_live(group, delta(run_id, 1, 1, "w009 ", offset=40))
    expect(live).to_have_text(text + "w008 w009 ")
    # A delta after words that never arrived says so instead of gluing them together.
    send_live(group, delta(run_id, 1, 1, "w011 ", offset=50))
    expect(live).to_have_text(text + "w008 w009  … w011 ")
    # Issue 29: the mark is not text received; the next delta continues, neither sliced nor
    # marked again.
    send_live(group, delta(run_id, 1, 1, "w012 ", offset=55))
    expect(live).to_have_text(text + "w008 w009  … w011 w012 ")
    # Another worker took the run over: its deltas (same step and attempt, another claim)
    # start the text afresh, never continue the dead worker's checkpoint.
    send_live(group, delta(run_id, 1, 1, "w001 ", claim=2, offset=0))
    expect(live).to_have_text("w001 ")
    expect(page.locator("#live-step")).to_contain_text("Another worker took over")


# -- issue 29: offsets come from the messages, gap marks only where a delta was missed ----------

WORDS = [f"w{i:03d} " for i in range(1, 41)]
MODEL_TEXT = "".join(WORDS)


def word_delta(run_id: str, i: int, count: int = 1, claim: int = 1) -> dict:
    """The delta carrying ``count`` words from word ``i`` (0-based), at its real offset."""
    text = "".join(WORDS[i : i + count])
    return delta(run_id, 1, 1, text, claim=claim, offset=len("".join(WORDS[:i])))


def test_a_viewer_from_the_start_sees_one_gap_mark_where_one_delta_was_missed(stack, page, sign_in):
    """Issue 29: after one real gap every later delta was marked as a gap or sliced
    ("w013 … w014 15 w016"): the page counted its own marks as received text."""
    run_id, group = open_run_page(stack, page, sign_in)
    live = page.locator("#live-text")
    for i in range(len(WORDS)):
        if i == 14:
            continue  # w015's delta never reaches this viewer
        send_live(group, word_delta(run_id, i))
    expected = "".join(WORDS[:14]) + " … " + "".join(WORDS[15:])
    expect(live).to_have_text(expected)
    expect(live).to_have_attribute("data-gaps", "1")
    expect(live).to_have_attribute("data-mid-answer", "false")


def test_a_viewer_from_the_start_with_every_delta_sees_exactly_the_models_text(
    stack, page, sign_in
):
    run_id, group = open_run_page(stack, page, sign_in)
    live = page.locator("#live-text")
    # Coalesced deltas (several words in one) and a repeat of text already drawn.
    send_live(group, word_delta(run_id, 0, 3))
    send_live(group, word_delta(run_id, 2, 4))  # w003 again, then w004..w006
    for i in range(6, len(WORDS)):
        send_live(group, word_delta(run_id, i))
    expect(live).to_have_text(MODEL_TEXT)
    expect(live).to_have_attribute("data-gaps", "0")


def test_a_late_joiner_without_a_checkpoint_sees_a_started_mid_answer_mark(stack, page, sign_in):
    run_id, group = open_run_page(stack, page, sign_in)
    live = page.locator("#live-text")
    # The opening ten words went out before this page subscribed, and no checkpoint exists.
    for i in range(10, len(WORDS)):
        send_live(group, word_delta(run_id, i))
    expect(live).to_have_text("… " + "".join(WORDS[10:]))
    expect(live).to_have_attribute("data-mid-answer", "true")
    expect(live).to_have_attribute("data-gaps", "0")
    expect(page.locator("#live-step")).to_contain_text("Started mid-answer")


def test_a_late_joiner_sees_the_checkpoint_then_the_live_tail(stack, page, sign_in):
    from runtime.models import StreamCheckpoint

    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    checkpoint = "".join(WORDS[:12])
    off_loop(
        StreamCheckpoint.objects.create, run_id=run_id, step=1, attempt=1, claim=1, text=checkpoint
    )
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    live = page.locator("#live-text")
    expect(live).to_have_text(checkpoint)
    group = run_group(run_id)
    for i in range(10, len(WORDS)):  # the first two overlap the checkpoint
        send_live(group, word_delta(run_id, i))
    expect(live).to_have_text(MODEL_TEXT)
    expect(live).to_have_attribute("data-gaps", "0")
    expect(live).to_have_attribute("data-mid-answer", "false")


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_reconnect_after_a_server_restart_marks_only_what_was_missed(
    stack, page, sign_in, checkpointed
):
    """Deltas sent while the server was down are missed: one mark, there, unless the
    checkpoint read on reconnect covers them (then the text is the model's, unmarked)."""
    from runtime.models import StreamCheckpoint

    run_id, group = open_run_page(stack, page, sign_in)
    live = page.locator("#live-text")
    status = page.locator("#live [data-live-status]")
    for i in range(10):
        send_live(group, word_delta(run_id, i))
    expect(live).to_have_text("".join(WORDS[:10]))
    stack.server.terminate()
    stack.server.wait(timeout=10)
    expect(status).to_contain_text(re.compile("Disconnected|cannot be reached"))
    for i in range(10, 13):
        send_live(group, word_delta(run_id, i))  # nobody receives these
    if checkpointed:
        off_loop(
            StreamCheckpoint.objects.create,
            run_id=run_id,
            step=1,
            attempt=1,
            claim=1,
            text="".join(WORDS[:13]),
        )
    stack.restart_server()
    expect(status).to_have_text("Live: connected.", timeout=20_000)
    for i in range(13, len(WORDS)):
        send_live(group, word_delta(run_id, i))
    if checkpointed:
        expect(live).to_have_text(MODEL_TEXT)
        expect(live).to_have_attribute("data-gaps", "0")
    else:
        expect(live).to_have_text("".join(WORDS[:10]) + " … " + "".join(WORDS[13:]))
        expect(live).to_have_attribute("data-gaps", "1")
    expect(live).to_have_attribute("data-mid-answer", "false")
