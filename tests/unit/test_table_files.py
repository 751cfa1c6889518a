"""Every table a later run reads is replaced whole: a disk that fills up mid-write leaves the old.

"auto" decides from the collectives' tables, the lessons read the benchmarks' tables, and the
book reads the notebooks' run times. A write that stops half-way (a full disk, an interrupted
`make bench`) must leave the previous table as it was, not a part of the new one, or every
later run fails on it. Each writer runs in a process whose files may not grow past half the
table's size (RLIMIT_FSIZE, as a full disk refuses the next block), after writing it once.
"""

import subprocess
import sys
import textwrap

import pytest

from lesson_code.harness.files import replacing

resource = pytest.importorskip("resource")  # POSIX: the limit on a file's size

# Each writer writes the same table into the file named by sys.argv[1].
WRITERS = {
    "collective times": """
        from lesson_code.collectives import choose
        choose.store_times(choose.stored_times(choose.STORED), "a note", path)""",
    "ddp benchmark": """
        from lesson_code.bench import stored
        table, _ = stored.load("ddp")
        stored.store(table, "ddp", "a description", path.parent)""",
    "pipeline benchmark": """
        from lesson_code.bench import pipeline
        note, table = pipeline.read_stored()
        pipeline.store(table, "\\n".join(note), path)""",
    "notebook run times": """
        from lesson_code.book_build import run_times
        run_times.write(path, {f"en/{n}.ipynb": {"notebook": f"en/{n}.ipynb", "seconds": "3",
                                                  "machine": "m" * 40, "date": "2026-12-03",
                                                  "code_hash": "h" * 64} for n in range(40)})""",
}
FILE_NAMES = {"ddp benchmark": "measured_ddp.csv"}
# Writes the table, then again with files limited to half its size; prints its first bytes.
TWICE = """
import resource, signal, sys
from pathlib import Path


def write():
{writer}


path = Path(sys.argv[1])
write()
before = path.read_bytes()
sys.stdout.write(before.hex())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, resource.RLIM_INFINITY))
try:
    write()
except OSError as error:
    sys.exit(f"refused: {{error}}")
"""


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_refused_half_way_leaves_the_old_table_whole(writer, tmp_path):
    path = tmp_path / FILE_NAMES.get(writer, "table.csv")
    code = TWICE.format(writer=textwrap.indent(textwrap.dedent(WRITERS[writer]), "    "))
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "refused: " in done.stderr, done.stderr[-2000:]
    before = bytes.fromhex(done.stdout)
    assert len(before) > 1000
    assert path.read_bytes() == before
    assert sorted(tmp_path.iterdir()) == [path]  # nothing left beside it


def test_a_table_becomes_the_new_one_when_its_block_ends(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    with replacing(path) as handle:
        handle.write("new\n")
        assert path.read_text() == "old\n"  # readers see the old table until the end
    assert path.read_text() == "new\n"
    with pytest.raises(KeyboardInterrupt), replacing(path) as handle:
        handle.write("newer, cut short")
        raise KeyboardInterrupt
    assert path.read_text() == "new\n" and sorted(tmp_path.iterdir()) == [path]
