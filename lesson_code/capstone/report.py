"""What the capstone (lesson 81) prints and writes: loss table, memory profile, manifest, metrics.

Plain text for a terminal (the notebook shows the same data as tables and figures). Rank 0's
records are the run's: every rank holds the same global loss and the same parameters.
`python -m lesson_code.capstone` prints all of it.

    print(loss_table(results[0]["records"]))
"""

from __future__ import annotations

import json
from pathlib import Path

from lesson_code.checkpoint import read_manifest


def loss_table(records: list[dict]) -> str:
    """One row per step: loss, global gradient norm, parameter norm, step time."""
    lines = ["step   loss     grad norm  param norm  step ms"]
    lines += [f"{r['step']:4d}  {r['loss']:.5f}  {r['grad_norm']:9.4f}  {r['param_norm']:10.5f}"
              f"  {1e3 * r['step_time_s']:7.1f}" for r in records]
    return "\n".join(lines)


def memory_table(results: list[dict]) -> str:
    """One row per rank: bytes of parameters, gradients and optimizer state, and 12 x shard."""
    numel, shard, padding = results[0]["numel"], results[0]["shard_numel"], results[0]["padding"]
    n = len(results)
    lines = [f"memory per rank (P = {numel} parameters, N = {n}, padding {padding}; "
             f"optimizer = 12 x {shard} = 12P/N{' + padding' if padding else ''})",
             "rank  parameters  gradients  optimizer  12P/N"]
    lines += [f"{r['rank']:4d}  {r['memory']['parameters']:10d}  {r['memory']['gradients']:9d}  "
              f"{r['memory']['optimizer']:9d}  {12 * (numel + padding) // n:5d}" for r in results]
    return "\n".join(lines)


def manifest_summary(folder: Path | str) -> str:
    """The checkpoint's manifest in a few lines: step, world size, every file with size and hash."""
    manifest = read_manifest(folder)
    lines = [f"checkpoint {folder}: step {manifest['step']}, world size {manifest['world_size']}, "
             f"format {manifest['format_version']}, manifest sha256 verified"]
    for entry in manifest["files"]:
        layout = entry["layout"]
        where = (f" elements {layout['start']}..{layout['start'] + layout['length'] - 1}"
                 if "start" in layout else " (replicated)")
        lines.append(f"  {entry['name']:26s} {entry['bytes']:7d} B  sha256 {entry['sha256'][:16]}…{where}")
    return "\n".join(lines)


def write_metrics(path: Path | str, records: list[dict], events: list[dict]) -> Path:
    """Write one JSON object per line: every step's metrics, then every guard event."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in records:
            handle.write(json.dumps({key: row[key] for key in
                                     ("step", "loss", "grad_norm", "step_time_s", "lr")}) + "\n")
        for event in events:
            handle.write(json.dumps(event) + "\n")
    return path


def read_metrics(path: Path | str) -> list[dict]:
    """The JSONL metrics back as a list of dicts (steps and events)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
