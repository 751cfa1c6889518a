"""An installed wheel, not only the checkout, carries everything `auto` reads.

`choose.stored_costs` reads the times shipped beside it (lesson_code/collectives/measured_*.csv);
a wheel built without one of them would raise FileNotFoundError the first time `auto` chose a
reduce-scatter or an all-gather, in any non-editable install. The wheel is built from a copy of
the sources (setuptools writes its build folders beside them), unpacked, and run from there.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USE_AUTO = """
import functools, pathlib, sys
import lesson_code
from lesson_code import collectives_lab, launch
from lesson_code.collectives import choose
assert pathlib.Path(lesson_code.__file__).is_relative_to(sys.argv[1]), lesson_code.__file__
for collective in choose.ALGORITHMS:
    print(collective, choose.stored_costs(collective=collective).source)
ops = ["auto all_reduce", "auto reduce_scatter", "auto all_gather"]
timed = functools.partial(collectives_lab.time_primitives, trials=1, min_trial_s=0.001, ops=ops)
rows = launch.spawn(timed, [64, 1 << 20], world_size=2, timeout_s=60)[0]
print(sorted({row["op"] for row in rows}))
"""


def test_auto_runs_from_an_installed_wheel(tmp_path):
    sources = tmp_path / "sources"
    sources.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, sources / name)
    shutil.copytree(ROOT / "lesson_code", sources / "lesson_code",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path / "dist"), str(sources)],
                   check=True, capture_output=True, timeout=300)
    wheel, = (tmp_path / "dist").glob("lesson_code-*.whl")
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)
    assert sorted(p.name for p in (installed / "lesson_code" / "collectives").glob("*.csv")) == \
        sorted(p.name for p in (ROOT / "lesson_code" / "collectives").glob("measured_*.csv"))

    environment = {**os.environ, "PYTHONPATH": str(installed), "LESSON_CODE_RESULTS": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", USE_AUTO, str(installed)], cwd=tmp_path,
                            env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        assert f"{collective} {installed}" in result.stdout, result.stdout
    assert "['auto all_gather', 'auto all_reduce', 'auto reduce_scatter']" in result.stdout
