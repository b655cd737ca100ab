"""The viewer's page in a real headless browser (Debian's ``chromium``, installed by
``scripts/setup.sh``, driven by Playwright): its filters show what they say, model and tool text
stays text (nothing in it runs), and a run's replay report is on the page."""

from __future__ import annotations

import json
import shutil

import pytest

from rstar2.analysis.view import view
from rstar2.rl.replay import Replay, StepResult, write_report

from .test_entropy_and_view import trajectory

# runs if it is ever not escaped: an attribute handler and a script, in model and tool text
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:  # never a skip: the suite's set-up installs it
        pytest.fail("chromium is not installed: run scripts/setup.sh (it installs Debian's)")
    return path


def hostile(d: dict) -> dict:
    d["turns"][0]["text"] += HOSTILE
    d["turns"][0]["calls"][0]["response"] += HOSTILE
    d["problem"] += HOSTILE
    return d


@pytest.fixture
def page_of_a_run(tmp_path):
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    silent = {**trajectory("ok", 1.0, True), "turns": [{"text": "no call", "model_tokens": 2, "calls": []}]}
    rows = [
        hostile(trajectory("ok", 1.0, kept=True)),
        hostile(trajectory("error", 0.0, kept=False)),
        hostile(trajectory("timeout", 1.0, kept=False)),
        silent,  # correct, kept, no tool call
        hostile(trajectory(None, 0.0)),  # a malformed call, no RoC (an evaluation's)
    ]
    (run / "samples" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    same = {"equal": True, "close": True, "run_norm": 1.0, "replay_norm": 1.0}
    moved = {"equal": False, "close": False, "run_norm": 1.0, "replay_norm": 1.5, "max_abs": 0.25}
    loss = {"run": 1.0, "replay": 1.0, "equal": True, "close": True}
    differs = {**loss, "replay": 2.0, "equal": False, "close": False}
    steps = [
        StepResult(1, {"model/w": same}, {"loss": loss}, True, True),
        StepResult(2, {"model/w": moved}, {"loss": differs}, True, False),
    ]
    write_report(run, Replay(str(run), "the run's start", steps, device="cpu"), "from_1_to_2")
    return view(run), rows


def test_the_viewer_filters_and_escapes_in_a_real_browser(page_of_a_run):
    from playwright.sync_api import sync_playwright

    path, rows = page_of_a_run
    dialogs: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(path.as_uri())
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")

            def shown() -> list[dict]:
                count = page.inner_text("#count")
                seen = page.evaluate(
                    "[...document.querySelectorAll('.traj')].filter(e => e.style.display !== 'none')"
                    ".map(e => ({...e.dataset}))"
                )
                assert count == str(len(seen))
                return seen

            # nothing the model or a tool wrote ran; it reads as the text it was
            assert page.evaluate("window.__pwned") is None and not dialogs
            assert page.evaluate("document.querySelectorAll('img, script:not(head script)').length") == 0
            body = page.inner_text("body")
            assert body.count(HOSTILE) == 3 * 4 and "I think <script>alert('x')</script>" in body

            assert len(shown()) == len(rows)
            page.select_option("#reward", "correct")
            assert [d["reward"] for d in shown()] == ["correct"] * 3
            page.select_option("#kept", "kept")  # filters combine
            assert len(shown()) == 2 and all(d["kept"] == "kept" for d in shown())
            page.select_option("#health", "no_call")
            assert len(shown()) == 1 and shown()[0]["health"] == "no_call"
            page.select_option("#health", "all")
            page.select_option("#kept", "all")
            page.select_option("#reward", "all")
            page.select_option("#status", "error")
            assert [d["statuses"] for d in shown()] == ["error"]
            page.select_option("#status", "malformed")
            assert len(shown()) == 1 and shown()[0]["kept"] == ""
            page.select_option("#status", "all")
            page.select_option("#kept", "dropped")
            assert len(shown()) == 2

            # the replay report: where the replay first differs from the run, and in which tensor
            replay = page.inner_text(".replay-report")
            assert "step 2 differs from the run" in replay.lower() and "model/w" in replay
        finally:
            browser.close()
