"""``rstar2 view``: one static HTML page of trajectories (tool calls, outputs, statuses, rewards,
RoC's choice, health signs), filtered in the page (offline), and a run's replay reports. All model
or tool text is escaped: it is untrusted."""

from __future__ import annotations

import contextlib
import html
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from ..jsonl import iter_jsonl
from ..rollout.health import SIGNS, signs
from ..rollout.trajectory import Trajectory

STATUS_COLOURS = {
    "ok": "#2e7d32",
    "error": "#c62828",
    "timeout": "#ef6c00",
    "memory": "#6a1b9a",
    "output_limit": "#8d6e63",
    "rejected": "#37474f",
    "internal": "#000000",
    "malformed": "#ad1457",
}


def find_files(target: Path) -> list[Path]:
    """A JSONL file as given; in a folder, every ``trajectories.jsonl`` and ``samples/*.jsonl``."""
    if target.is_file():
        return [target]
    files = sorted(target.rglob("trajectories.jsonl")) + sorted(target.rglob("samples/*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{target}: no trajectories.jsonl or samples/*.jsonl inside")
    return files


def health_signs(d: dict[str, Any]) -> list[str]:
    """The tool-use health signs a trajectory shows; none for a line that is not a whole one."""
    try:
        shown = signs(Trajectory.from_dict(d))
    except (ValueError, TypeError, KeyError, AttributeError):
        return []
    return [s for s in SIGNS if shown[s]]


def load(
    files: list[Path], limit: int | None = None, sign: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Trajectories of ``files``; with ``sign``, only those showing that health sign."""
    found = (
        (str(f), d)
        for f in files
        for _, d in iter_jsonl(f, strict=False)  # a line cut by a crash is skipped
        if isinstance(d, dict) and "turns" in d and (sign is None or sign in health_signs(d))
    )
    return list(islice(found, limit))


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _call_html(call: dict[str, Any]) -> str:
    result = call.get("result")
    status = "malformed" if result is None else str(result.get("status", "internal"))
    colour = STATUS_COLOURS.get(status, "#000")
    args = call.get("arguments") or {}
    code = args.get("code", "") if isinstance(args, dict) else ""
    extra = f" · {result.get('duration_s', 0):.2f} s" if result else ""
    error = f"<div class='err'>{_e(call.get('error'))}</div>" if call.get("error") else ""
    return (
        f"<div class='call'><span class='status' style='background:{colour}'>{_e(status)}</span> "
        f"<code>{_e(call.get('name') or '?')}</code>{_e(extra)}{error}"
        f"<pre class='code'>{_e(code)}</pre><pre class='out'>{_e(call.get('response', ''))}</pre></div>"
    )


def trajectory_html(n: int, source: str, d: dict[str, Any], shown: list[str]) -> str:
    """``shown``: the health signs the trajectory shows (``health_signs``)."""
    turns = d.get("turns") or []
    calls = [c for t in turns for c in t.get("calls", [])]
    statuses = sorted(
        {"malformed" if c.get("result") is None else str(c["result"].get("status")) for c in calls}
    )
    reward = float(d.get("reward", 0.0))
    meta = d.get("meta") or {}
    roc = meta.get("roc") or {}
    model_tokens = sum(d.get("loss_mask") or [])
    facts = [
        f"reward <b>{reward:g}</b>",
        f"finish <b>{_e(d.get('finish_reason'))}</b>",
        f"{len(d.get('response_ids') or [])} response tokens ({model_tokens} from the model)",
        f"{len(calls)} calls",
    ]
    if d.get("answer") is not None:
        facts.append(f"answer <code>{_e(d['answer'])}</code>")
    kept = ("kept" if roc.get("kept") else "dropped") if roc else ""
    if roc:
        facts.append(
            f"RoC: <b>{kept}</b>, p_err {float(roc.get('p_err', 0)):.2f}, p_format {float(roc.get('p_format', 0)):.2f}"
        )
    if "step" in meta:
        facts.append(f"step {_e(meta['step'])}")
    if shown:
        facts.append("health: " + ", ".join(f"<b>{_e(SIGNS[s])}</b>" for s in shown))
    body = []
    for t in turns:
        body.append(f"<pre class='model'>{_e(t.get('text', ''))}</pre>")
        body += [_call_html(c) for c in t.get("calls", [])]
    return (
        f"<section class='traj' data-reward='{'correct' if reward > 0 else 'incorrect'}' "
        f"data-statuses='{_e(' '.join(statuses))}' data-kept='{kept}' "
        f"data-health='{_e(' '.join(shown) or 'healthy')}'>"
        f"<details><summary>#{n} · {' · '.join(facts)}</summary>"
        f"<p class='src'>{_e(source)}</p><p class='problem'>{_e(d.get('problem', ''))}</p>"
        f"<p class='ref'>reference: <code>{_e(d.get('reference'))}</code> · {_e(d.get('verdict', ''))}</p>"
        f"{''.join(body)}</details></section>"
    )


STYLE = """
body{font:14px/1.5 system-ui,sans-serif;margin:1.5em;max-width:80em}
.bar{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ccc}
.traj{border-bottom:1px solid #eee;padding:.3em 0} summary{cursor:pointer}
pre{white-space:pre-wrap;margin:.3em 0;padding:.4em;border-radius:4px}
.model{background:#f5f7ff}.code{background:#f4f4f4}.out{background:#fffbe6}
.status{color:#fff;padding:0 .4em;border-radius:3px;font-size:12px}
.call{margin-left:1.5em}.src{color:#888;font-size:12px}.err{color:#ad1457}
"""

SCRIPT = """
function apply(){
  const r=document.getElementById('reward').value, s=document.getElementById('status').value,
        k=document.getElementById('kept').value, h=document.getElementById('health').value;
  let shown=0;
  for(const el of document.querySelectorAll('.traj')){
    const ok=(r==='all'||el.dataset.reward===r)&&(s==='all'||el.dataset.statuses.split(' ').includes(s))
      &&(k==='all'||el.dataset.kept===k)&&(h==='all'||el.dataset.health.split(' ').includes(h));
    el.style.display=ok?'':'none'; if(ok) shown++;
  }
  document.getElementById('count').textContent=shown;
}
"""


def replay_html(name: str, report: str) -> str:
    """One ``rstar2 replay`` report as the replay wrote it (``RUN/replay/*.md``: each step redone,
    equal to the run or where it differs first, a what-if's two sides), its verdict in the heading."""
    verdict = next(
        (ln.strip("* ") for ln in report.splitlines() if ln.startswith(("Every step", "**Step"))), ""
    )
    return (
        f"<section class='replay-report'><details open><summary>{_e(name)}: {_e(verdict)}</summary>"
        f"<pre>{_e(report)}</pre></details></section>"
    )


def render(
    items: list[tuple[str, dict[str, Any]]],
    title: str = "rstar2 trajectories",
    replays: Sequence[tuple[str, str]] = (),
) -> str:
    options = "".join(f"<option value='{s}'>{s}</option>" for s in sorted(STATUS_COLOURS))
    correct = sum(float(d.get("reward", 0)) > 0 for _, d in items)
    shown = [health_signs(d) for _, d in items]
    counts = {s: sum(s in signs_ for signs_ in shown) for s in SIGNS}
    health_options = "".join(
        f"<option value='{s}'>{_e(words)} ({counts[s]})</option>" for s, words in SIGNS.items()
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body onload='apply()'>"
        f"<h1>{_e(title)}</h1><p>{len(items)} trajectories, {correct} correct.</p>"
        "<div class='bar'>reward <select id='reward' onchange='apply()'><option value='all'>all</option>"
        "<option value='correct'>correct</option><option value='incorrect'>incorrect</option></select> "
        f"tool status <select id='status' onchange='apply()'><option value='all'>any</option>{options}</select> "
        "RoC <select id='kept' onchange='apply()'><option value='all'>all</option>"
        "<option value='kept'>kept</option><option value='dropped'>dropped</option></select> "
        "tool-use health <select id='health' onchange='apply()'><option value='all'>any</option>"
        f"<option value='healthy'>no sign</option>{health_options}</select> "
        "· showing <span id='count'></span></div>"
        + (
            "<h2>Replays (rstar2 replay)</h2>" + "".join(replay_html(n, r) for n, r in replays)
            if replays
            else ""
        )
        + "".join(trajectory_html(i, src, d, shown[i]) for i, (src, d) in enumerate(items))
        + "</body></html>"
    )


def problems_page(rows: list[dict[str, Any]], title: str) -> str:
    """A file of problems (a run's ``problems.jsonl``, a stage's ``train.jsonl``): each problem with
    its answer and where it came from (a reasoning-gym task, a generator's family)."""
    cards = "".join(
        f"<section class='traj'><details><summary>#{n} · answer <code>{_e(r.get('answer'))}</code> · "
        f"{_e(r.get('source') or r.get('family') or '')}</summary><p class='problem'>{_e(r.get('problem'))}</p>"
        "</details></section>"
        for n, r in enumerate(rows)
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>"
        f"</head><body><h1>{_e(title)}</h1><p>{len(rows)} problems.</p>{cards}</body></html>"
    )


def view(target: Path, out: Path | None = None, limit: int | None = 2000, sign: str | None = None) -> Path:
    """``sign``: only trajectories showing that tool-use health sign (``rollout.health.SIGNS``). A
    file of problems rather than trajectories is shown as its problems."""
    if sign is not None and sign not in SIGNS:
        raise ValueError(f"unknown health sign {sign!r}: one of {', '.join(SIGNS)}")
    files = find_files(target)
    if out is None:
        out = (target if target.is_dir() else target.parent) / "view.html"
    title = f"rstar2 · {target.name}"
    first = next((d for _, d in iter_jsonl(target, strict=False)), None) if target.is_file() else None
    if isinstance(first, dict) and "problem" in first and "turns" not in first:
        rows = [d for _, d in iter_jsonl(target, strict=False) if isinstance(d, dict)]
        out.write_text(problems_page(rows[:limit], title))
    else:
        replays = []
        for f in sorted(target.rglob("replay/*.md")) if target.is_dir() else []:
            with contextlib.suppress(OSError):
                replays.append((str(f.relative_to(target)), f.read_text()))
        out.write_text(render(load(files, limit, sign), title, replays))
    return out
