"""A benchmark run on the reader's machine writes its tables beside the package, never into it.

The tables the lessons show ship with the package; `make bench` measures the reader's machine
and writes bench-results/ (which "auto" then prefers on this machine), so the checkout stays
clean and the next `git pull` merges. Only `--into-package` replaces the package's tables.
"""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lesson_code import memory
from lesson_code.bench import capstone as capstone_bench
from lesson_code.bench import collectives as collectives_bench
from lesson_code.bench import stored
from lesson_code.bench import zero as zero_bench
from lesson_code.collectives import choose
from lesson_code.harness.timing import machine_line

from own_tables import write_ring_fastest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def package_tables() -> dict[Path, bytes]:
    """Every measured table that ships with the package, and its bytes."""
    return {path: path.read_bytes() for path in sorted(stored.STORED.rglob("measured_*.csv"))}


def git_status() -> str:
    """What git sees changed or added in the package (other tests may write elsewhere meanwhile)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--",
                           "lesson_code"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def test_a_full_benchmark_run_stores_into_its_results_folder_and_leaves_the_checkout_clean(tmp_path):
    before_tables, before_status = package_tables(), git_status()
    assert len(before_tables) == 9  # ddp, zero, zero_stages, pipeline, capstone and its curve;
    #                                 three collectives
    done = subprocess.run([sys.executable, "-m", "lesson_code.bench", "capstone", "--world-size",
                           "2", "--repeats", "1", "--out-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert package_tables() == before_tables and git_status() == before_status
    note, table = capstone_bench.read_stored(tmp_path / capstone_bench.STORED.name)
    assert f"machine: {machine_line()}" in note and table["same_losses"].all()
    assert f"stored in {tmp_path / capstone_bench.STORED.name}" in done.stdout
    note, curve = capstone_bench.read_curve(tmp_path / capstone_bench.CURVE.name)
    assert f"machine: {machine_line()}" in note
    assert [row["event"] for row in curve if "event" in row] == ["rollback"]


def test_the_zero_benchmark_writes_the_bytes_a_rank_sent_in_mb_of_ten_to_the_six(tmp_path):
    zero_bench.run(world_size=2, out_dir=tmp_path, quick=True)  # quick: written, never stored
    table = pd.read_csv(tmp_path / "zero.csv", index_col=0)
    ring = memory.traffic_per_step("ZeRO-1", table.loc["zero", "parameters"], 2, dtype_bytes=4)
    sent = table.loc[["ddp", "zero", "naive_zero"], "MB_sent_per_step"].tolist()
    assert sent == pytest.approx([ring / 1e6, ring / 1e6, 1.5 * ring / 1e6], rel=1e-6)


def test_the_results_folder_is_beside_the_package_and_can_be_moved(monkeypatch, tmp_path):
    monkeypatch.delenv(choose.RESULTS_VARIABLE, raising=False)
    assert choose.results_folder() == ROOT / "bench-results"
    assert "bench-results/" in (ROOT / ".gitignore").read_text().splitlines()
    monkeypatch.setenv(choose.RESULTS_VARIABLE, str(tmp_path))
    assert choose.results_folder() == tmp_path


def test_auto_prefers_this_machines_own_times_and_ignores_another_machines(monkeypatch, tmp_path):
    rows = choose.stored_times(choose.STORED)
    monkeypatch.setenv(choose.RESULTS_VARIABLE, str(tmp_path))
    here = choose.store_times(rows, f"measured here\nmachine: {machine_line()}",
                              tmp_path / choose.STORED.name)
    assert choose.measured_here("all_reduce") == here
    choose.store_times(rows, f"measured here, busy\nmachine: {machine_line()}, load average 3.20 at"
                             " the start", here)
    assert choose.measured_here("all_reduce") == here  # the load says how busy, not which machine
    choose.store_times(rows, "measured elsewhere\nmachine: riscv64, 64 cores, Linux, Python 3.12.1,"
                             " torch 2.13.0+cpu", here)
    assert choose.measured_here("all_reduce") is None  # another machine's: the package's are used
    assert choose.measured_here("reduce_scatter") is None  # none measured here


def test_the_side_by_side_auto_decides_from_the_tables_the_run_just_stored(monkeypatch, tmp_path,
                                                                           capsys):
    # This machine's older tables, where "auto" looks by default, make the ring fastest; the
    # run stores its own into another folder (--out-dir), and its "auto" must follow those.
    older = write_ring_fastest(tmp_path / "older")
    monkeypatch.setenv(choose.RESULTS_VARIABLE, str(older))
    monkeypatch.setattr(collectives_bench, "SIZES", [2 ** 10, 2 ** 12])  # two, for a fit
    monkeypatch.setattr(collectives_bench, "TRIALS", 1)
    monkeypatch.setattr(collectives_bench, "MIN_TRIAL_S", 0.001)
    out = tmp_path / "out"
    out.mkdir()
    collectives_bench.run(world_size=2, out_dir=out)
    printed = capsys.readouterr().out
    for collective, packaged in choose.STORED_FILES.items():
        just_stored = choose.stored_costs(out / packaged.name, collective).decisions(2)
        assert f"auto {collective} ran " + ", ".join(
            f"{name} from {start} B" for start, name in zip(just_stored.starts,
                                                              just_stored.algorithms)) \
            + f" (decided from {out / packaged.name})" in printed.splitlines(), printed
    assert str(older) not in printed
