"""``--dlcheck-report=PATH``: one self-contained HTML file (no network, no external assets) with every
check's outcome and evidence, and pictures: llm batches token by token, sample images with their
boxes and channel statistics, histograms and series. Figures are drawn by matplotlib to inline SVG
(without pyplot, so the user's matplotlib backend is left alone)."""

from __future__ import annotations

import hashlib
import html
import io
import json
from pathlib import Path
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}.meta{color:#5b6475;font-size:13px;margin-bottom:16px}
.counts span{display:inline-block;margin-right:14px;font-weight:600}
table.results{border-collapse:collapse;margin:12px 0 24px;font-size:14px}
table.results td,table.results th{padding:4px 10px;border-bottom:1px solid #e3e6ea;text-align:left}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff}
.passed{background:#2e7d32}.failed{background:#c62828}.error{background:#8e24aa}.skipped{background:#9e9e9e}
.not_applicable{background:#78909c}.missing_role{background:#f9a825}
section h3{font-size:17px;margin:22px 0 10px;border-bottom:2px solid #e3e6ea;padding-bottom:4px}
.failed-card{border-left:4px solid #c62828}.error-card{border-left:4px solid #8e24aa}
ul.grouped{font-size:14px;padding-left:18px}ul.grouped li{margin:4px 0}.reason{color:#37474f}
.gid{display:inline-block;font-weight:700;font-size:12px;background:#eceff1;border-radius:4px;padding:0 5px;margin-left:3px}
.artifact.shared{font-size:13px;color:#5b6475;margin:6px 0}
.card{background:#fff;border:1px solid #e3e6ea;border-radius:8px;padding:12px 16px;margin:0 0 16px}
.card h2{font-size:16px;margin:0 0 8px}.card .node{color:#5b6475;font-size:12px;font-weight:400}
dl.why{display:grid;grid-template-columns:90px 1fr;gap:2px 10px;margin:8px 0;font-size:14px}
dl.why dt{font-weight:700;color:#5b6475}dl.why dd{margin:0;white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;font-size:13px}
.tokens{font-family:ui-monospace,Menlo,monospace;font-size:12px;line-height:22px;margin:6px 0}
.tokens .row{white-space:nowrap;overflow-x:auto;padding:2px 0}.tokens .rowlabel{color:#5b6475;margin-right:6px}
.tok{display:inline-block;padding:0 3px;margin:0 1px;border-radius:3px;border:1px solid transparent}
.tok.sup{background:#c8e6c9}.tok.ign{background:#eceff1;color:#546e7a}.tok.pad{background:repeating-linear-gradient(45deg,#fff,#fff 3px,#e0e0e0 3px,#e0e0e0 6px);color:#9e9e9e}
.tok.doc{border-left:3px solid #1565c0}
.legend span{margin-right:12px;font-size:12px}.figure{margin:8px 0}.figure svg{max-width:100%;height:auto}
table.coverage{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
table.coverage td,table.coverage th{padding:2px 10px;border-bottom:1px solid #e3e6ea;text-align:right}
table.coverage td:first-child,table.coverage th:first-child{text-align:left;font-weight:700}
.health{background:#fdecea;border-left:4px solid #c62828;padding:8px 12px;margin:8px 0;font-size:14px}
.partly_judged{background:#7cb342}
.caption{font-size:12px;color:#5b6475}details summary{cursor:pointer;color:#1565c0;font-size:13px;margin:4px 0}
"""


def esc(text: Any) -> str:
    return html.escape(str(text))


def _svg(fig) -> str:
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    FigureCanvasSVG(fig)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def render_tokens(art: dict[str, Any]) -> str:
    """One line per example: supervised tokens green, label -100 grey, padding hatched, a blue bar where a
    packed document starts."""
    out = [
        '<div class="legend"><span class="tok sup">supervised</span><span class="tok ign">label -100</span>'
        '<span class="tok pad">padding (attention 0)</span><span class="tok doc">document start</span></div>',
        '<div class="tokens">',
    ]
    for row in art.get("rows", []):
        cells = []
        tokens, labels = row.get("tokens", []), row.get("labels")
        mask, starts = row.get("attention_mask"), set(row.get("doc_starts", []))
        for i, tok in enumerate(tokens):
            cls = ["tok"]
            label = labels[i] if labels else None
            if mask is not None and not mask[i]:
                cls.append("pad")
            elif label is not None:
                cls.append("ign" if label == -100 else "sup")
            if i in starts and i > 0:
                cls.append("doc")
            title = f"pos {i} · id {row['input_ids'][i]} · label {label} · mask {mask[i] if mask is not None else '-'}"
            cells.append(f'<span class="{" ".join(cls)}" title="{esc(title)}">{esc(tok)}</span>')
        out.append(f'<div class="row"><span class="rowlabel">{esc(row.get("name", ""))}</span>{"".join(cells)}</div>')
    out.append("</div>")
    return "".join(out)


def render_images(art: dict[str, Any]) -> str:
    """Sample inputs (HWC in [0, 1]) with their boxes (xyxy, pixels) and per-channel statistics."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    images = art.get("images", [])
    if not images:
        return ""
    n = len(images)
    fig = Figure(figsize=(2.4 * n, 2.8))
    for i, item in enumerate(images):
        ax = fig.add_subplot(1, n, i + 1)
        pixels = np.clip(np.asarray(item["pixels"], dtype=float), 0, 1)
        ax.imshow(pixels if pixels.shape[-1] == 3 else pixels[..., 0], cmap=None if pixels.shape[-1] == 3 else "gray")
        if item.get("mask") is not None:
            ax.imshow(np.asarray(item["mask"]), alpha=0.35, cmap="tab20", interpolation="nearest")
        for box in item.get("boxes", []):
            x1, y1, x2, y2 = box[:4]
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="#ff1744", linewidth=1.5))
        ax.set_title(item.get("title", ""), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    return f'<div class="figure">{_svg(fig)}</div><div class="caption">{esc(art.get("caption", ""))}</div>'


def render_histogram(art: dict[str, Any]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 2.6))
    ax = fig.add_subplot(1, 1, 1)
    series = art.get("series") or {art.get("name", "values"): art.get("values", [])}
    for name, values in series.items():
        ax.hist(values, bins=art.get("bins", 30), alpha=0.6, label=name)
    for mark in art.get("marks", []):
        ax.axvline(mark["x"], color="#c62828", linestyle="--", linewidth=1, label=mark.get("label"))
    if len(series) > 1 or art.get("marks"):
        ax.legend(fontsize=8)
    ax.set_title(art.get("title", ""), fontsize=9)
    return f'<div class="figure">{_svg(fig)}</div><div class="caption">{esc(art.get("caption", ""))}</div>'


def render_series(art: dict[str, Any]) -> str:
    """Curves over steps: ``series`` {name: values} (None or NaN leaves a gap), optional ``x`` {name: xs}, a
    second axis for ``series2`` (e.g. the learning rate under the loss), ``marks`` [{x, label}] drawn as
    vertical lines (the step where two runs part, a spike, the first NaN), ``bands`` [{lo, hi, label}] as
    shaded horizontal ranges (a confidence band, a declared target)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 2.8))
    ax = fig.add_subplot(1, 1, 1)
    xs = art.get("x", {})
    for name, values in art.get("series", {}).items():
        values = [float("nan") if v is None else v for v in values]
        ax.plot(xs.get(name, range(len(values))), values, label=name, marker="." if len(values) <= 60 else None)
    if art.get("logy"):
        ax.set_yscale("log")
    for band in art.get("bands", []):
        ax.axhspan(band["lo"], band["hi"], color="#90caf9", alpha=0.3, label=band.get("label"))
    for mark in art.get("marks", []):
        ax.axvline(mark["x"], color="#c62828", linestyle="--", linewidth=1)
        ax.annotate(
            mark.get("label", ""),
            (mark["x"], 1),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="#c62828",
            rotation=90,
            va="top",
            ha="right",
        )
    ax.set_xlabel(art.get("xlabel", "step"), fontsize=8)
    ax.set_ylabel(art.get("ylabel", ""), fontsize=8)
    if art.get("series2"):
        ax2 = ax.twinx()
        for name, values in art["series2"].items():
            values = [float("nan") if v is None else v for v in values]
            ax2.plot(xs.get(name, range(len(values))), values, label=name, color="#6a1b9a", linestyle=":")
        ax2.set_ylabel(art.get("ylabel2", ""), fontsize=8)
        ax2.legend(fontsize=7, loc="upper right")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(art.get("title", ""), fontsize=9)
    return f'<div class="figure">{_svg(fig)}</div><div class="caption">{esc(art.get("caption", ""))}</div>'


def render_bars(art: dict[str, Any]) -> str:
    """Named values as bars (``values`` {name: number}), with an optional reference line ``expect``."""
    from matplotlib.figure import Figure

    values = art.get("values", {})
    fig = Figure(figsize=(5.6, 2.6))
    ax = fig.add_subplot(1, 1, 1)
    for band in art.get("bands", []):
        ax.axhspan(band["lo"], band["hi"], color="#a5d6a7", alpha=0.4, label=band.get("label"))
    ci = art.get("ci", {})
    errs = None
    if ci:
        lows = [v - ci.get(k, [v, v])[0] for k, v in values.items()]
        highs = [ci.get(k, [v, v])[1] - v for k, v in values.items()]
        errs = [[max(x, 0) for x in lows], [max(x, 0) for x in highs]]
    ax.bar(range(len(values)), list(values.values()), color="#5c6bc0", yerr=errs, capsize=6)
    if art.get("bands"):
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(values)), list(values), fontsize=7, rotation=30, ha="right")
    if art.get("expect") is not None:
        ax.axhline(art["expect"], color="#c62828", linestyle="--", linewidth=1, label=art.get("expect_label", ""))
        ax.legend(fontsize=7)
    ax.set_title(art.get("title", ""), fontsize=9)
    return f'<div class="figure">{_svg(fig)}</div><div class="caption">{esc(art.get("caption", ""))}</div>'


RENDERERS = {
    "tokens": render_tokens,
    "images": render_images,
    "histogram": render_histogram,
    "series": render_series,
    "bars": render_bars,
}


SECTIONS = (
    ("failed", "Failed — what the checks found"),
    ("error", "Errors — checks that could not judge"),
    ("passed", "Passed — with what each measured"),
    ("skipped", "Undecided and information"),
)
GROUPED = (("not_applicable", "Not applicable — by reason"), ("missing_role", "Missing role — by fixture"))
ERROR_KINDS = {
    "internal": "internal error of pytest-dlcheck (ours to fix: please report it)",
    "role": "your role raised",
    "timeout": "stopped by its time bound",
    "setup": "a fixture failed at setup",
}


def cost_text(res: dict[str, Any]) -> str:
    cost = res.get("cost") or {}
    parts = [
        f"{cost[k]} {label}"
        for k, label in (("forward", "fwd"), ("backward", "bwd"), ("optimizer_steps", "steps"))
        if cost.get(k)
    ]
    return ((" · " + ", ".join(parts)) if parts else "") + time_text(res)


def time_text(res: dict[str, Any]) -> str:
    """The check's wall-time split (pytest_dlcheck.walltime): the user's work by category, the plugin's own,
    the shared runs it made (timed apart) or waited for."""
    t = res.get("time") or {}
    if not t:
        return ""
    by = ", ".join(f"{c} {s:.2g}" for c, s in (t.get("user_by") or {}).items() if s > 0)
    text = f" · user {t['user']:.2g}s" + (f" ({by})" if by else "") + f", plugin {t['plugin']:.2g}s"
    if t.get("shared_made"):
        text += f", made {esc(', '.join(t['shared_made']))} ({t['shared']:.2g}s, timed apart)"
    if t.get("shared_waited"):
        text += f", waited for {esc(', '.join(t['shared_waited']))}"
    return text


class Pictures:
    """Renders each distinct picture once: a second card showing the same data (the token view of the
    shared batch under L2, L11, L13…) gets a link to the first instead of a copy."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        #: figures left out because matplotlib cannot be imported (said once, at the top of the report)
        self.left_out = 0

    def render(self, art: dict[str, Any], owner: str) -> str:
        key = hashlib.sha1(json.dumps(art, sort_keys=True, default=str).encode()).hexdigest()[:12]
        kind = esc(art["kind"])
        if key in self.seen:
            return (
                f'<div class="artifact shared" data-kind="{kind}" data-ref="pic-{key}">the same picture as '
                f'<a href="#pic-{key}">{esc(self.seen[key])}</a></div>'
            )
        try:
            body = RENDERERS[art["kind"]](art)
        except ImportError as exc:
            if not (exc.name or "").startswith("matplotlib"):
                raise
            self.left_out += 1
            return ""
        self.seen[key] = owner
        return f'<div class="artifact" id="pic-{key}" data-kind="{kind}">{body}</div>'


#: said once at the top of a report whose figures were left out
NO_MATPLOTLIB = (
    "{n} figure(s) left out: matplotlib is not installed; "
    'pip install "pytest-dlcheck[report]" (or matplotlib) draws them'
)


def render_card(res: dict[str, Any], pictures: Pictures | None = None) -> str:
    pictures = pictures or Pictures()
    outcome = res["outcome"]
    label = outcome.replace("_", " ")
    if outcome == "error" and res.get("error_kind"):
        label = f"error · {ERROR_KINDS.get(res['error_kind'], res['error_kind'])}"
    partly = outcome == "passed" and bool(res.get("not_judged"))
    if partly:
        label = "passed · partly judged"
    parts = [
        f'<div class="card {esc(outcome)}-card" id="{esc(res["nodeid"])}" data-check="{esc(res["id"])}" '
        f'data-outcome="{esc(outcome)}"{" data-partly-judged" if partly else ""}>',
        f'<h2><span class="badge {"partly_judged" if partly else esc(outcome)}">{esc(label)}</span> {esc(res["id"])} {esc(res["title"])} '
        f'<span class="node">[{esc(res["domain"])}] {esc(res["nodeid"])} · {res["duration"]:.2f}s{cost_text(res)}</span></h2>',
    ]
    rows = [
        ("evidence", "\n".join(res["evidence"])),
        ("cause", res["cause"]),
        ("fix", res["fix"]),
        ("error", res["error"]),
        ("skipped", res["reason"]),
    ]
    if partly:
        rows.insert(1, ("not judged", "\n".join(f"{p['part']}: {p['reason']}" for p in res["not_judged"])))
    rows = [(k, v) for k, v in rows if v]
    if outcome == "passed" and not res["evidence"]:
        rows.insert(0, ("evidence", "(this pass recorded no measurement)"))
    if rows:
        parts.append('<dl class="why">' + "".join(f"<dt>{k}</dt><dd>{esc(v)}</dd>" for k, v in rows) + "</dl>")
    shown = [
        pictures.render(a, f"{res['id']} ({res['nodeid']})") for a in res["artifacts"] if a.get("kind") in RENDERERS
    ]
    shown = [s for s in shown if s]  # a figure left out without matplotlib
    if shown:
        # open where something is wrong; a click away where all is well
        opened = " open" if outcome in ("failed", "error") else ""
        parts.append(f"<details{opened}><summary>what the check looked at</summary>{''.join(shown)}</details>")
    parts.append("</div>")
    return "".join(parts)


def grouped_reason(check_id: str, reason: str) -> str:
    """A skip reason as grouped across checks: the check's own ID left out ("not applicable: DF1 concerns
    diffusion training, ..." and DF2's same reason are one reason)."""
    import re

    return re.sub(rf"^([a-z ]+:\s*){re.escape(check_id)} (?=[a-z])", r"\1", reason, count=1)


def render_grouped(results: list[dict[str, Any]]) -> str:
    """Not-applicable and missing-role outcomes: one line per reason with the checks it concerns."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(grouped_reason(r["id"], r["reason"]), []).append(r)
    items = []
    for reason, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = " ".join(
            f'<span class="gid" id="{esc(r["nodeid"])}" data-check="{esc(r["id"])}" data-outcome="{esc(r["outcome"])}" '
            f'title="{esc(r["title"])}">{esc(r["id"])}</span>'
            for r in rs
        )
        items.append(f'<li><span class="reason">{esc(reason)}</span> <span class="ids">{ids}</span></li>')
    return f'<ul class="grouped">{"".join(items)}</ul>'


COVERAGE_COLUMNS = (
    ("judged", "judged"),
    ("failed", "failed"),
    ("passed", "passed"),
    ("partly_judged", "partly judged"),
    ("error", "error"),
    ("not_applicable", "not applicable"),
    ("missing_role", "missing a role"),
    ("undecided", "undecided"),
)


def render_coverage(doc: dict[str, Any]) -> str:
    """Per domain, how many selected checks judged the pipeline; then the usage errors of domains that judged
    nothing (what to hand over)."""
    coverage = doc.get("coverage") or {}
    if not coverage:
        return ""
    head = "".join(f"<th>{esc(label)}</th>" for _, label in COVERAGE_COLUMNS)
    rows = "".join(
        f'<tr data-domain="{esc(d)}"><td>{esc(d)}</td>'
        + f"<td>{c['judged']} of {c['selected']}</td>"
        + "".join(f"<td>{c[k] or ''}</td>" for k, _ in COVERAGE_COLUMNS[1:])
        + "</tr>"
        for d, c in coverage.items()
    )
    health = "".join(f'<div class="health">usage error: {esc(text)}</div>' for text in doc.get("health") or [])
    return f'<table class="coverage" id="coverage"><tr><th>domain</th>{head}</tr>{rows}</table>{health}'


def render(doc: dict[str, Any]) -> str:
    summary = doc["summary"]
    counts = "".join(
        f'<span data-outcome="{k}"><span class="badge {k}">{v}</span> {k.replace("_", " ")}</span>'
        for k, v in summary.items()
    )
    by: dict[str, list[dict[str, Any]]] = {}
    for r in doc["results"]:
        by.setdefault(r["outcome"], []).append(r)
    pictures = Pictures()
    body = []
    for outcome, title in SECTIONS:
        if by.get(outcome):
            cards = "".join(render_card(r, pictures) for r in by[outcome])
            body.append(f'<section id="{outcome}"><h3>{esc(title)} ({len(by[outcome])})</h3>{cards}</section>')
    for outcome, title in GROUPED:
        if by.get(outcome):
            body.append(
                f'<section id="{outcome}"><h3>{esc(title)} ({len(by[outcome])})</h3>{render_grouped(by[outcome])}'
                "</section>"
            )
    versions = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    note = (
        f'<div class="meta" id="no-figures">{esc(NO_MATPLOTLIB.format(n=pictures.left_out))}</div>'
        if pictures.left_out
        else ""
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>pytest-dlcheck report</title>'
        f"<style>{CSS}</style></head><body>"
        f'<h1>pytest-dlcheck report</h1><div class="meta">{esc(doc["created"])} · selection {esc(doc["selection"])} · '
        f"{doc['duration']:.1f}s{session_time_text(doc)} · python {esc(doc['python'])} · {esc(versions)}</div>"
        f'<div class="counts" id="summary">{counts}</div>{render_coverage(doc)}{note}'
        + "".join(body)
        + "</body></html>"
    )


def write_html(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(doc), encoding="utf-8")


def session_time_text(doc: dict[str, Any]) -> str:
    """The plugin's share of the checks' wall time (the shared runs' split included)."""
    t = doc.get("time") or {}
    if not t.get("checks"):
        return ""
    return f" (checks {t['checks']:.1f}s: user {t['user']:.1f}s, plugin {t['plugin']:.1f}s, {t['plugin_share']:.0%})"
