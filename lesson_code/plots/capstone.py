"""Figures of lesson 81: the loss curve drawn from the run's metrics (the rows of metrics.jsonl,
read with capstone.report.read_metrics), and the memory profile of every rank.

    loss_curve_figure(read_metrics("capstone-run/metrics.jsonl"), lang="fa")
"""

from __future__ import annotations

from matplotlib.figure import Figure

from lesson_code.plots import label_ranks, start_figure

LABELS = {
    "en": {"step": "step", "loss": "loss", "rollback": "rollback", "rank": "rank",
           "bytes": "bytes per rank", "parameters": "parameters", "gradients": "gradients",
           "optimizer": "optimizer state", "formula": "12P/N"},
    "fa": {"step": "گام", "loss": "زیان", "rollback": "بازگشت به چکپوینت", "rank": "رتبه",
           "bytes": "بایت در هر رتبه", "parameters": "پارامترها", "gradients": "گرادیان‌ها",
           "optimizer": "وضعیت بهینه‌ساز", "formula": "12P/N"},
}


def loss_curve_figure(rows: list[dict], lang: str = "en") -> Figure:
    """Loss per step from metrics rows (step records and guard events), rollbacks marked."""
    steps = [r for r in rows if "step" in r]
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.6))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], marker="o", markersize=3)
    for event in (r for r in rows if r.get("event") == "rollback"):
        ax.axvline(event["to_step"], color="#d62728", linestyle=":", label=labels["rollback"])
    ax.set_xlabel(labels["step"])
    ax.set_ylabel(labels["loss"])
    if any(r.get("event") for r in rows):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_profile_figure(results: list[dict], lang: str = "en") -> Figure:
    """Stacked bars per rank (parameters, gradients, optimizer) and the line 12P/N (+ padding)."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.6))
    ranks = [r["rank"] for r in results]
    bottoms = [0] * len(results)
    for part, colour in (("parameters", "#8fbbd9"), ("gradients", "#c7c7c7"), ("optimizer", "#1f77b4")):
        heights = [r["memory"][part] for r in results]
        ax.bar(ranks, heights, bottom=bottoms, color=colour, label=labels[part])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    numel, padding = results[0]["numel"], results[0]["padding"]
    ax.axhline(12 * (numel + padding) / len(results), color="#d62728", linestyle="--",
               label=labels["formula"])
    return label_ranks(fig, ax, ranks, labels, labels["bytes"])
