"""``rstar2 analyze entropy``: run the entropy analysis over a trajectories file and write it out as
Markdown, JSON, PNG plots and an HTML page of tokens coloured by entropy."""

from __future__ import annotations

import html
import json
from itertools import islice
from pathlib import Path
from typing import Any

from ..chat.token_classes import CLASSES, TokenClasses, classify
from ..config import DEFAULT_ROLLOUT, DEFAULT_RUN
from ..jsonl import iter_jsonl
from ..plots import pyplot, save_figure
from .entropy import Summary, TrajectoryEntropy, mark_high, summarize, teacher_forced_entropy


def analyze(
    model_path: str | Path,
    trajectories: Path,
    out: Path,
    *,
    top: float = 0.2,
    window: int = DEFAULT_RUN.reflection_window,
    limit: int | None = None,
    temperature: float = DEFAULT_ROLLOUT.temperature,
    device: str = "auto",
    progress: bool = True,
) -> Summary:
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from ..adapters import load_model
    from ..device import pick_device

    model = load_model(model_path).to(pick_device(device)).eval()  # an adapter checkpoint merged
    tok = AutoTokenizer.from_pretrained(str(model_path))
    lines = (d for _, d in iter_jsonl(trajectories, strict=False) if isinstance(d, dict))  # cut lines skipped
    rows = list(islice((d for d in lines if "response_ids" in d and "prompt_ids" in d), limit))
    if not rows:
        raise ValueError(f"{trajectories}: no trajectories with prompt_ids and response_ids")
    decoded = TokenClasses(tok, window)  # each token id decoded once
    bar = tqdm(rows, desc="entropy", unit="traj", disable=not progress)
    items = [_entropy_of(d, model, decoded, top, window, temperature) for d in bar]
    summary = summarize(items)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"model": str(model_path), "trajectories": str(trajectories), "top": top, "window": window}
    report = {**settings, "count": len(items), "classes": summary.rows(), "top_tokens": summary.top_tokens}
    report["by_position"] = summary.by_position
    (out / "entropy.json").write_text(json.dumps(report, indent=1))
    (out / "entropy.md").write_text(markdown(summary, settings, len(items)))
    plot(summary, out / "entropy.png")
    (out / "tokens.html").write_text(tokens_html(items[:20], top))
    return summary


def _entropy_of(
    d: dict[str, Any], model: Any, decoded: TokenClasses, top: float, window: int, temperature: float
) -> TrajectoryEntropy:
    """One trajectory's response tokens: their entropy under ``model`` (none on tool output), their
    classes and the ``top`` share of them marked high."""
    resp, mask = d["response_ids"], d.get("loss_mask") or [1] * len(d["response_ids"])
    ent = teacher_forced_entropy(model, d["prompt_ids"], resp, temperature) if resp else []
    entropy = [e if m else None for e, m in zip(ent, mask, strict=True)]
    pieces = [decoded.piece(i) for i in resp]
    classes, high = classify(pieces, mask, window), mark_high(entropy, top)
    return TrajectoryEntropy(
        pieces, entropy, classes, high, float(d.get("reward", 0.0)), str(d.get("problem", ""))
    )


def markdown(s: Summary, settings: dict[str, Any], count: int) -> str:
    lines = [
        "# Token entropy",
        "",
        f"{count} trajectories of `{settings['trajectories']}` under `{settings['model']}`; high-entropy = "
        f"the top {settings['top']:.0%} of each trajectory's model tokens; reflection = the first "
        f"{settings['window']} model tokens after a tool response.",
        "",
        "| class | tokens | high-entropy | share of the class that is high | share of all high | mean entropy (nats) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in s.rows():
        lines.append(
            f"| {r['class']} | {r['tokens']} | {r['high']} | {r['high_share_in_class']:.1%} | "
            f"{r['share_of_high']:.1%} | {r['mean_entropy']:.3f} |"
        )
    lines += ["", "Most frequent high-entropy tokens:", ""]
    for c in CLASSES:
        toks = ", ".join(f"`{t}` ({n})" for t, n in s.top_tokens.get(c, [])) or "—"
        lines.append(f"- **{c}**: {toks}")
    lines += ["", "![entropy](entropy.png)", "", "Tokens coloured by entropy: [tokens.html](tokens.html)", ""]
    return "\n".join(lines)


def plot(s: Summary, path: Path) -> None:
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(11, 3.8))
    rows = s.rows()
    a.bar([r["class"] for r in rows], [100 * r["high_share_in_class"] for r in rows], color="#c0504d")
    a.set_ylabel("% of the class's tokens that are high-entropy")
    a.set_title("Where the high-entropy tokens are")
    xs = [(i + 0.5) / len(s.by_position) for i in range(len(s.by_position))]
    b.plot(xs, s.by_position, marker="o", ms=3)
    b.set_xlabel("relative position in the response (model tokens)")
    b.set_ylabel("mean entropy (nats)")
    b.set_title("Entropy over the response")
    save_figure(fig, path)


def tokens_html(items: list[TrajectoryEntropy], top: float) -> str:
    """Each trajectory's tokens on a white-to-red scale of entropy; high-entropy tokens underlined,
    tool tokens grey. Model text is escaped: it is untrusted."""
    hi = max((e for it in items for e in it.entropy if e is not None), default=1.0)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>rstar2 token entropy</title>",
        "<style>body{font:14px/1.6 system-ui,sans-serif;margin:2em;max-width:70em}"
        ".t{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px}"
        ".tool{color:#888}.high{text-decoration:underline 2px}"
        "section{border-top:1px solid #ccc;margin-top:1.5em;padding-top:.5em}</style>",
        f"<h1>Token entropy</h1><p>Red = higher entropy (max {hi:.2f} nats); underlined = the top "
        f"{top:.0%} of the trajectory's model tokens; grey = tool output (not generated).</p>",
    ]
    for n, it in enumerate(items):
        parts.append(
            f"<section><h3>#{n} · reward {it.reward:g}</h3><p>{html.escape(it.problem[:400])}</p><div class='t'>"
        )
        for piece, e, c, h in zip(it.pieces, it.entropy, it.classes, it.high, strict=True):
            text = html.escape(piece)
            if e is None:
                parts.append(f"<span class='tool'>{text}</span>")
            else:
                cls = " class='high'" if h else ""
                t = max(0.0, min(1.0, e / hi)) if hi > 0 else 0.0
                style = f"background:rgba(220, 60, 40, {0.05 + 0.85 * t:.2f})"
                parts.append(f"<span{cls} style='{style}' title='{c} · {e:.3f}'>{text}</span>")
        parts.append("</div></section>")
    return "".join(parts)
