"""What the capstone (lesson 81) prints and writes: loss table, memory profile, manifest, metrics.

Plain text for a terminal (the notebook shows the same data as tables and figures), in English or
Persian (`lang="fa"`, for `python -m lesson_code.capstone --lang fa`): the words change, and a
number inside a sentence is written by the course's rule (`language.number`: Persian digits); the
numbers of the tables and the names of files and tensors do not. Rank 0's records are the run's:
every rank holds the same global loss and the same parameters. `python -m lesson_code.capstone`
prints all of it.

    print(loss_table(results[0]["records"]))
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lesson_code.checkpoint import read_manifest
from lesson_code.language import check_language, number

WORDS = {
    "en": {
        "loss_header": "step   loss     grad norm  param norm  step ms",
        "memory_title": "memory per rank (P = {numel} parameters, N = {n}, padding {padding}; "
                        "optimizer = 12 x {shard} = 12P/N{plus})",
        "memory_header": "rank  parameters  gradients  optimizer  12P/N",
        "plus_padding": " + padding",
        "manifest": "checkpoint {folder}: step {step}, world size {world_size}, format {format}, "
                    "manifest sha256 verified",
        "file": "  {name:26s} {size:>7} B  sha256 {digest}…{where}",
        "elements": " elements {first}..{last}",
        "replicated": " (replicated)",
        "not_finite": "loss is {loss}: not finite",
        "spike": "loss {loss} is more than {factor} times the previous step's {previous}",
    },
    "fa": {
        "loss_header": "گام   زیان     نُرم گرادیان  نُرم پارامترها  میلی‌ثانیه",
        "memory_title": "حافظهٔ هر رتبه به بایت: {numel} پارامتر (P)، {n} رتبه (N)، پدینگ {padding}؛ "
                        "وضعیت بهینه‌ساز = ۱۲ × {shard} = 12P/N{plus}",
        "memory_header": "رتبه  پارامترها  گرادیان‌ها  بهینه‌ساز  12P/N",
        "plus_padding": " + پدینگ",
        "manifest": "چکپوینت گام {step} با {world_size} رتبه، قالب {format}؛ چکیدهٔ sha256 مانیفست وارسی شد: "
                    "\u200e{folder}",  # LRM: the path's leading "/" or "..." stays at its left end
        "file": "  {name:26s} {size:>7} بایت  sha256 {digest}…{where}",
        "elements": "  عنصرهای {first} تا {last}",
        "replicated": "  (یکسان روی همهٔ رتبه‌ها)",
        "not_finite": "زیان {loss} است و متناهی نیست",
        "spike": "زیان {loss} بیش از {factor} برابر زیان گام قبل ({previous}) است",
    },
}


def words(lang: str) -> dict[str, str]:
    """The report's phrases in `lang` ("en" or "fa")."""
    return WORDS[check_language(lang)]


def reason_text(reason: str, lang: str = "en") -> str:
    """The divergence guard's reason (`DivergenceGuard.check`, always English) in `lang`."""
    if check_language(lang) == "en":
        return reason
    spike = re.fullmatch(r"loss (\S+) is more than (\S+) times the previous step's (\S+)", reason)
    if spike:
        loss, factor, previous = (number(value, lang) for value in spike.groups())
        return words(lang)["spike"].format(loss=loss, factor=factor, previous=previous)
    not_finite = re.fullmatch(r"loss is (\S+): not finite", reason)
    if not_finite:
        return words(lang)["not_finite"].format(loss=not_finite.group(1))
    return reason


def loss_table(records: list[dict], lang: str = "en") -> str:
    """One row per step: loss, global gradient norm, parameter norm, step time."""
    lines = [words(lang)["loss_header"]]
    lines += [f"{r['step']:4d}  {r['loss']:.5f}  {r['grad_norm']:9.4f}  {r['param_norm']:10.5f}"
              f"  {1e3 * r['step_time_s']:7.1f}" for r in records]
    return "\n".join(lines)


def memory_table(results: list[dict], lang: str = "en") -> str:
    """One row per rank: bytes of parameters, gradients and optimizer state, and 12 x shard."""
    numel, shard, padding = results[0]["numel"], results[0]["shard_numel"], results[0]["padding"]
    n, said = len(results), words(lang)
    lines = [said["memory_title"].format(numel=number(numel, lang), n=number(n, lang),
                                         padding=number(padding, lang), shard=number(shard, lang),
                                         plus=said["plus_padding"] if padding else ""),
             said["memory_header"]]
    lines += [f"{r['rank']:4d}  {r['memory']['parameters']:10d}  {r['memory']['gradients']:9d}  "
              f"{r['memory']['optimizer']:9d}  {12 * (numel + padding) // n:5d}" for r in results]
    return "\n".join(lines)


def manifest_summary(folder: Path | str, lang: str = "en") -> str:
    """The checkpoint's manifest in a few lines: step, world size, every file with size and hash.

    Reads it with `read_manifest`, which raises a CheckpointError unless manifest.sha256 matches.
    """
    manifest, said = read_manifest(folder), words(lang)
    lines = [said["manifest"].format(folder=folder, step=number(manifest["step"], lang),
                                     world_size=number(manifest["world_size"], lang),
                                     format=number(manifest["format_version"], lang))]
    for entry in manifest["files"]:
        layout = entry["layout"]
        where = (said["elements"].format(first=number(layout["start"], lang),
                                         last=number(layout["start"] + layout["length"] - 1, lang))
                 if "start" in layout else said["replicated"])
        # Persian groups thousands, as its prose writes byte counts
        size = number(entry["bytes"], lang, "," if lang == "fa" else "")
        lines.append(said["file"].format(name=entry["name"], size=size,
                                         digest=entry["sha256"][:16], where=where))
    return "\n".join(lines)


METRIC_KEYS = ("step", "loss", "grad_norm", "step_time_s", "lr")


def metrics_line(row: dict) -> str:
    """One line of metrics.jsonl: a step's metrics (METRIC_KEYS), or a guard event as it is."""
    kept = row if "event" in row else {key: row[key] for key in METRIC_KEYS}
    return json.dumps(kept) + "\n"


def write_metrics(path: Path | str, records: list[dict], events: list[dict]) -> Path:
    """Write one JSON object per line: every step's metrics, then every guard event."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(metrics_line(row) for row in [*records, *events])
    return path


class MetricsLog:
    """The run's metrics.jsonl as it trains: a line per step or guard event, appended at once.

    A run that is killed leaves the lines of every step it finished. `path` None (every rank but
    0) writes nothing. A run that continues from a checkpoint first rewrites the file with the
    checkpoint's `history` ({"records": ..., "events": ...}), dropping what the killed attempt
    trained after it, so the file always holds the run as it will be continued.
    """

    def __init__(self, path: Path | None, history: dict):
        self.path = path
        if path is not None:
            write_metrics(path, history["records"], history["events"])

    def write(self, row: dict) -> dict:
        """Append `row` (one write of one line, flushed); return it."""
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(metrics_line(row))
        return row


def write_summary(path: Path | str, summary: dict) -> Path:
    """Write the run's summary (`python -m lesson_code.capstone`'s run.json: where it started,
    its steps and world size, each check's verdict) as one JSON object, for scripts."""
    path = Path(path)
    path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return path


def read_metrics(path: Path | str) -> list[dict]:
    """The JSONL metrics back as a list of dicts (steps and events).

    A last line cut short (the run was killed while writing it) is left out; any other line
    that is not JSON raises ValueError naming the file and the line.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
    rows = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if line_number == len(lines) and not line.endswith("\n"):
                break  # cut short by a kill: the step it logged is not in the file
            raise ValueError(f"{path}, line {line_number}: not a JSON object ({error})") from None
    return rows
