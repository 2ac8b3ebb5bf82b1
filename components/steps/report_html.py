"""The run report as one self-contained HTML page: no script, no external file, so that it reads
the same in the Kubeflow UI's sandboxed frame (HTMLViewer.tsx: iframe srcdoc) and from disk."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from components.steps.auc_text import auc_text

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #999; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #eee; }
.decision { padding: 0.8em 1em; font-size: 1.3em; font-weight: bold; border-radius: 4px; }
.pushed { background: #2e7d32; color: #fff; }
.refused { background: #c62828; color: #fff; }
.samples { display: flex; flex-wrap: wrap; gap: 0.8em; }
figure { margin: 0; font-size: 0.85em; text-align: center; }
.wrong { color: #c62828; font-weight: bold; }
"""
METRICS = ("auc", "binary_accuracy", "binary_crossentropy")  # each beside the served model's
MULTI_CLASS_METRICS = ("auc", "accuracy", "top_2_accuracy", "sparse_categorical_crossentropy")


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.{digits}f}"
    return f"{int(value):,}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _decision(facts: dict[str, Any]) -> str:
    if facts["pushed_version"] is not None:
        return f'<p class="decision pushed">Pushed: version {facts["pushed_version"]}</p>'
    why = facts["not_pushed_reason"] or "; ".join(facts["failures"]) or "see the Pusher's log"
    return f'<p class="decision refused">Not pushed: {escape(why)}</p>'


def _data(data: dict[str, Any]) -> str:
    """Examples per split, then each feature's range or counts in each split."""
    splits = list(data["splits"])
    rows = [["examples", *(f"{data['splits'][s]:,}" for s in splits)], *data["features"]]
    return _table(["feature", *splits], rows)


def _validation(validation: dict[str, Any]) -> str:
    columns = validation["columns"]
    parts = [_table(["split: column", "anomaly"], sorted(columns.items())) if columns
             else "<p>No anomalies against the curated schema (a span with anomalies stops the "
             "run before this report).</p>"]  # fmt: skip
    baseline = validation["drift_baseline_span"]
    if baseline < 0:
        parts.append("<p>Drift: no earlier span has passed validation; nothing to compare.</p>")
    else:
        rows = [[d["column"], _number(d["distance"]), _number(d["threshold"])]
                for d in validation["drift"]]  # fmt: skip
        parts.append(f"<p>Drift of the eval split against span {baseline}:</p>"
                     + _table(["column", "distance", "threshold"], rows))  # fmt: skip
    return "".join(parts)


def _metrics(metrics: dict[str, dict[str, float]], names: tuple[str, ...] = METRICS) -> str:
    header = ["slice", "examples"]
    for name in names:
        header += [name, f"{name} (served model)"]
    rows = []
    for slice_name in ["overall", *sorted(s for s in metrics if s != "overall")]:
        values = metrics.get(slice_name, {})
        row: list[Any] = [slice_name, _number(values.get("example_count"))]
        for name in names:
            value, diff = values.get(name), values.get(f"{name}_diff")
            baseline = None if value is None or diff is None else value - diff
            shown = auc_text(values) if name == "auc" else _number(value)
            row += [shown, _number(baseline)]
        rows.append(row)
    return _table(header, rows)


def _roc_svg(curve: list[dict[str, float]], size: int = 260) -> str:
    points = sorted((m.get("falsePositiveRate", 0.0), m.get("recall", 0.0)) for m in curve)
    path = " ".join(f"{x * size:.1f},{size - y * size:.1f}" for x, y in points)
    return (f'<svg width="{size + 40}" height="{size + 30}" role="img" aria-label="ROC curve">'
            f'<g transform="translate(30,5)"><rect width="{size}" height="{size}" fill="none" '
            f'stroke="#999"/><line x1="0" y1="{size}" x2="{size}" y2="0" stroke="#ccc"/>'
            f'<polyline points="{path}" fill="none" stroke="#1565c0" stroke-width="2"/>'
            f'<text x="{size / 2 - 40}" y="{size + 20}" font-size="11">false positive rate</text>'
            f'<text transform="translate(-8,{size / 2 + 15}) rotate(-90)" font-size="11">recall'
            f'</text>'
            f'</g></svg>')  # fmt: skip


def _steps(steps: dict[str, tuple[float, float]]) -> str:
    """Each step's seconds in the order they ran; a step whose outputs came from the cache
    started before this run's first step (SelectSpans, never cached)."""
    run_start = steps.get("SelectSpans", (min((s for s, _ in steps.values()), default=0), 0))[0]
    rows, total = [], 0.0
    for step, (start, seconds) in steps.items():
        if start < run_start:
            rows.append([f"{step} (cached: an earlier run's time)", f"{seconds:.1f}"])
        else:
            rows.append([step, f"{seconds:.1f}"])
            total += seconds
    return _table(["step", "seconds"], [*rows, ["all steps of this run", f"{total:.1f}"]])


def confusion_rows(facts: dict[str, Any]) -> list[list[float]]:
    """The confusion matrix, [true class][predicted class] counts, in class_names' order."""
    if facts.get("multi_class"):
        size = len(facts["class_names"])
        matrix = [list(row) + [0.0] * (size - len(row)) for row in facts["matrix"] or []]
        return (matrix + [[0.0] * size] * size)[:size]
    m = facts["confusion"]
    return [[m.get("trueNegatives", 0.0), m.get("falsePositives", 0.0)],
            [m.get("falseNegatives", 0.0), m.get("truePositives", 0.0)]]  # fmt: skip


def _per_class(overall: dict[str, Any], labels: list[str]) -> str:
    rows = [[label, _number(overall.get(f"precision[{label}]")),
             _number(overall.get(f"recall[{label}]"))] for label in labels]  # fmt: skip
    return _table(["class", "precision (at 0.5)", "recall (at 0.5)"], rows)


def _samples(samples: list[dict[str, Any]]) -> str:
    """Eval images with their true and predicted class, inline (data: URIs)."""
    figures = []
    for sample in samples:
        wrong = sample["label"] is not None and sample["label"] != sample["predicted"]
        image = (f'<img src="data:image/jpeg;base64,{sample["thumbnail"]}" alt="'
                 f'{escape(sample["path"])}"><br>' if sample["thumbnail"] else "")  # fmt: skip
        figures.append(
            f'<figure title="{escape(sample["path"])}">{image}'
            f"<figcaption>true: {escape(str(sample['label']))}<br>"
            f'<span class="{"wrong" if wrong else ""}">predicted: '
            f"{escape(sample['predicted'])} ({sample['score']:.2f})</span></figcaption></figure>"
        )
    return f'<div class="samples">{"".join(figures)}</div>'


def _multi_class(facts: dict[str, Any]) -> str:
    labels = facts["class_names"]
    rows = confusion_rows(facts)
    cells = [[label, *(_number(c) for c in row)] for label, row in zip(labels, rows, strict=True)]
    matrix = _table(["true \\ predicted", *labels], cells)
    return (
        f"<h3>Confusion matrix (the most probable class)</h3>{matrix}"
        f"<h3>Each class against the rest</h3>"
        f"{_per_class(facts['metrics'].get('overall', {}), labels)}"
        f"<h3>Eval images</h3>"
        f"{_samples(facts['samples']) if facts['samples'] else '<p>No eval images.</p>'}"
    )


def _binary(facts: dict[str, Any]) -> str:
    from components.steps.evaluation import SERVING_THRESHOLD

    labels = facts["class_names"]
    curve, m = facts["curve"], facts["confusion"]
    confusion = _table(
        ["true \\ predicted", *labels],
        [[labels[0], _number(m.get("trueNegatives")), _number(m.get("falsePositives"))],
         [labels[1], _number(m.get("falseNegatives")), _number(m.get("truePositives"))]],
    )  # fmt: skip
    return (
        "<h3>ROC curve (eval split)</h3>"
        f"{_roc_svg(curve) if curve else '<p>No ROC curve was computed.</p>'}"
        f"<h3>Confusion matrix at threshold {SERVING_THRESHOLD}</h3>{confusion}"
    )


def _tuning(tuning: dict[str, Any]) -> str:
    """Where the hyperparameters came from; after a search, its trials sorted by the objective
    (best first) and the objective over the trials."""
    if not tuning:
        return ""
    search, source = tuning.get("search") or {}, tuning.get("source") or "defaults"
    if source != "search":
        said = ("the use case's defaults and the config" if source == "defaults"
                else f"the search behind {source} (tune=0)")  # fmt: skip
        values = ", ".join(f"{k}={v}" for k, v in sorted((search.get("values") or {}).items()))
        return f"<h2>Hyperparameters</h2><p>From {escape(said)}{': ' if values else ''}" + (
            f"{escape(values)}.</p>"
        )  # fmt: skip
    objective, trials = search["objective"], tuning["trials"]
    names = sorted({name for t in trials for name in t.get("values", {})})
    ranked = sorted(trials, key=lambda t: -(t.get("metrics") or {}).get(objective, -math.inf))
    rows = [[t["trial_id"], t["status"], _number((t.get("metrics") or {}).get(objective)),
             t.get("steps", "-"), t.get("seconds", "-"),
             *[t.get("values", {}).get(n, "") for n in names], t.get("error", "")[:200]]
            for t in ranked]  # fmt: skip
    header = ["trial", "status", objective, "steps", "seconds", *names, "error"]
    return (f"<h2>Hyperparameter search</h2><p>{escape(search['algorithm'])}: "
            f"{search['completed']} of {search['trials']} trials completed; best {objective} "
            f"{search['best_value']:.4f} in trial {escape(str(search['best_trial']))}, whose "
            f"values trained this model.</p>{_table(header, rows)}"
            f"{_objective_svg(trials, objective)}")  # fmt: skip


def _objective_svg(trials: list[dict], objective: str, width: int = 360, height: int = 160) -> str:
    """Each completed trial's objective (squares) and the best so far (line), by trial."""
    points = [(int(t["trial_id"]), t["metrics"][objective]) for t in trials
              if t.get("status") == "COMPLETED"]  # fmt: skip
    if not points:
        return ""
    points.sort()
    last = max(max(i for i, _ in points), 1)
    low, high = min(v for _, v in points), max(v for _, v in points)
    span = (high - low) or 1.0

    def at(i: int, v: float) -> tuple[float, float]:
        return i / last * width, height - (v - low) / span * height

    squares = []
    for i, v in points:  # each trial a small square centred on its point
        x, y = at(i, v)
        squares.append(f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" '
                       'fill="#1565c0"/>')  # fmt: skip
    dots = "".join(squares)
    best, line = -math.inf, []
    for i, v in points:
        best = max(best, v)
        line.append("{:.1f},{:.1f}".format(*at(i, best)))
    return (f'<svg width="{width + 60}" height="{height + 40}" role="img" '
            f'aria-label="{escape(objective)} over trials"><g transform="translate(45,10)">'
            f'<rect width="{width}" height="{height}" fill="none" stroke="#999"/>{dots}'
            f'<polyline points="{" ".join(line)}" fill="none" stroke="#2e7d32"/>'
            f'<text x="{width / 2 - 20}" y="{height + 25}" font-size="11">trial</text>'
            f'<text x="-40" y="10" font-size="10">{high:.3f}</text>'
            f'<text x="-40" y="{height}" font-size="10">{low:.3f}</text></g></svg>')  # fmt: skip


def render(facts: dict[str, Any]) -> str:
    multi_class = facts.get("multi_class", False)
    failures = "".join(f"<li>{escape(f)}</li>" for f in facts["failures"])
    spans = ", ".join(str(s) for s in facts["spans"]) or str(facts["span"])
    change = facts["auc_change"]
    compared = (f"Not compared with the served model: {facts['not_compared']}."
                if facts.get("not_compared")
                else "No served model to compare with: judged on the thresholds alone."
                if change is None or facts["baseline_auc"] is None
                else f"AUC {facts['auc']:.4f} against the served model's "
                f"{facts['baseline_auc']:.4f} on this eval data ({change:+.4f}).")  # fmt: skip
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Run report: span {facts["span"]}</title>
<style>{STYLE}</style></head><body>
<h1>Run report: span {facts["span"]}</h1>
{_decision(facts)}
<h2>Data</h2>
<p>Spans read: {escape(spans)}; fingerprint <code>{escape(str(facts["fingerprint"]))}</code>.</p>
{_data(facts["data"])}
<h2>Validation</h2>
{_validation(facts["validation"])}
<h2>Evaluation</h2>
<p>{escape(compared)} Blessed: {"yes" if facts["blessed"] else "no"}.</p>
{f"<ul>{failures}</ul>" if failures else ""}
{_metrics(facts["metrics"], MULTI_CLASS_METRICS if multi_class else METRICS)}
{_multi_class(facts) if multi_class else _binary(facts)}
{_tuning(facts.get("tuning") or {})}
<h2>Step times (seconds of each step's work)</h2>
{_steps(facts["steps"])}
</body></html>
"""
