"""Every stored benchmark table says what, when and where it measured in both editions
(bench.stored.note_text): the English as its benchmark wrote it, the Persian from the same facts."""

import re

import pytest

from lesson_code.bench import capstone as capstone_bench
from lesson_code.bench import collectives as collectives_bench
from lesson_code.bench import pipeline as pipeline_bench
from lesson_code.bench import stored
from lesson_code.collectives import choose

NAMES = ["ddp", "zero", "zero_stages"]
FILES = {"collectives " + name: path for name, path in choose.STORED_FILES.items()} | {
    "pipeline": pipeline_bench.STORED, "capstone": capstone_bench.STORED,
    "capstone curve": capstone_bench.CURVE}
# The Latin a Persian note keeps: names of models, optimizers, libraries, dtypes, schedules.
NAMES_KEPT = {"MiniGPT", "Adam", "DDP", "NaiveDDP", "ZeRO", "gloo", "torch", "float32", "fp32",
              "F1B"}


def latin_words(text: str) -> set[str]:
    """Latin words of a Persian note outside `code` and left-to-right isolates."""
    text = re.sub("`[^`]*`|\u2066[^\u2069]*\u2069", " ", text)
    return set(re.findall(r"[A-Za-z][A-Za-z0-9]*", text)) - NAMES_KEPT


@pytest.mark.parametrize("name", NAMES)
def test_a_stored_tables_note_reads_in_both_editions(name):
    _, note = stored.load(name)
    english = stored.note_text(note, "en")
    assert english == f"{note['description']}\nmeasured {note['measured']} on {note['machine']}"
    persian = stored.note_text(note, "fa")
    assert len(persian.splitlines()) == 2 and not latin_words(persian), persian
    assert "اندازه‌گیری‌شده در \u2066" in persian and "هسته" in persian  # date, machine


@pytest.mark.parametrize("label", sorted(FILES))
def test_a_tables_comment_lines_read_in_both_editions(label):
    lines = stored.comment_lines(FILES[label])
    assert stored.note_text(lines, "en") == "\n".join(lines)
    persian = stored.note_text(lines, "fa")
    assert not latin_words(persian), persian
    assert persian.splitlines()[-1].startswith("دستگاه: ") and "\u2066python -m lesson_code.bench" in persian
    assert "`" not in persian  # a printed line: the command isolated, not in backticks


def test_the_benchmarks_write_the_sentences_the_notes_read():
    for line in (collectives_bench.machine_note(4, 7, "reduce_scatter"),
                 pipeline_bench.machine_note(5)):
        persian = stored.note_text(line.splitlines(), "fa")
        assert not latin_words(persian), persian
    assert "کاهش و پخش" in stored.note_text(
        collectives_bench.machine_note(4, 7, "reduce_scatter").splitlines(), "fa")
    assert stored.description("ddp", parameters="1,000", ranks=2, batch=8, rounds=2, steps=1,
                              load="1.00").startswith(
        "lesson 77 benchmark: MiniGPT with 1,000 parameters, 2 ranks")


def test_the_collectives_note_records_the_load_at_the_start():
    # On shared cores the stored times are mostly waits for a core: the note must say the load.
    note = collectives_bench.machine_note(4, 7, "all_reduce")
    assert re.search(r"^machine: .*, load average \d+\.\d\d at the start$", note, re.M), note
    at_start = "x86_64, 2 cores, Linux, Python 3.11.7, torch 2.13.0+cpu, load average 1.50 at the start"
    given = collectives_bench.machine_note(4, 7, "all_gather", at_start)
    assert given.endswith("\nmachine: " + at_start)
    assert "میانگین بار ۱٫۵۰ در آغاز" in stored.note_text(given.splitlines(), "fa")


def test_numbers_follow_the_rule_and_an_unknown_line_stays_as_it_is():
    persian = stored.note_text(["lesson 77 benchmark: MiniGPT with 4,788,224 parameters, 4 ranks, "
                                "batch 8 per rank, Adam; 24 rounds in alternation, 1 step(s) of each "
                                "variant per round; of each step the phases of its slowest rank, "
                                "medians over all steps; load average 9.83 at the end"], "fa")
    assert "۴٬۷۸۸٬۲۲۴ پارامتر روی ۴ رتبه" in persian and "میانگین بار ۹٫۸۳ در پایان" in persian
    assert stored.note_text(["something else"], "fa") == "something else"
    with pytest.raises(ValueError, match="unknown language 'de'"):
        stored.note_text(["x"], "de")


def test_a_persian_note_glosses_a_row_without_repeating_its_name():
    # The English glosses a lowercase row label ("ddp = our bucketed DDP ..."); the Persian table
    # shows that row as «DDP», so «DDP یعنی DDP ...» would explain a name by itself.
    for english, persian in stored.DESCRIPTIONS.values():
        assert not re.search(r"\b(\w+) یعنی \1\b", persian), persian


def test_the_lesson_78_note_names_the_row_its_table_shows():
    # The Persian table shows our bucketed DDP as «BucketedDDP» beside «DDP با
    # ZeroRedundancyOptimizer»: a note about «the DDP row» would fit both rows.
    _, note = stored.load("zero")
    persian = stored.note_text(note, "fa")
    assert "(سطر \u2066BucketedDDP\u2069: " in persian, persian
