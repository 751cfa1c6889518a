"""The lessons show their tables with Persian labels in the Persian edition.

The code cells are the same in both editions, so the labels come from the lessons' plots modules
(`plots.collectives.localized`, `plots.ddp.localized`, `plots.zero.localized`, ...); these tests
check that every label they know is translated, that the English edition is left as computed,
that the values are never touched, and that the terms the lessons share are written once
(`language.TERMS`) while every label shows as it did.
"""

import ast
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from lesson_code import language
from lesson_code.plots import capstone, checkpoint, collectives, ddp, pipeline, scale, zero

PERSIAN_LETTER = re.compile(r"[\u0600-\u06FF]")
MODULES = [pytest.param(collectives, id="lesson 76"), pytest.param(ddp, id="lesson 77"),
           pytest.param(zero, id="lesson 78")]
KEPT_AS_NAMES = {"DDP", "ZeRO-1", "ZeroRedundancyOptimizer", "auto / gloo", "N =",  # not words
                 "MLP", "MiniGPT", "SGD", "Adam"}


@pytest.mark.parametrize("module", MODULES)
def test_every_label_becomes_persian(module) -> None:
    labels = module.TABLE_LABELS
    frame = pd.DataFrame([range(len(labels))], columns=list(labels), index=["rank"])
    shown = module.localized(frame.rename_axis("stage"), "fa")
    untranslated = [label for label in shown.columns
                    if label not in KEPT_AS_NAMES and not PERSIAN_LETTER.search(label)]
    assert not untranslated, f"labels left without Persian: {untranslated}"
    assert shown.index.tolist() == ["رتبه"] and shown.to_numpy().tolist() == frame.to_numpy().tolist()


@pytest.mark.parametrize("module", MODULES)
def test_english_edition_is_unchanged(module) -> None:
    series = pd.Series({"forward": 1.5, "backward": 2.5}, name="rank").rename_axis("rank")
    pd.testing.assert_series_equal(module.localized(series, "en"), series)
    shown = module.localized(series, "fa")
    assert shown.name == "رتبه" and shown.index.name == "رتبه"
    assert shown.tolist() == [1.5, 2.5]


def test_an_unknown_language_is_refused() -> None:
    with pytest.raises(ValueError, match="'de'"):
        ddp.localized(pd.Series([1.0]), "de")


def test_a_label_shared_by_lessons_78_and_78a_has_one_persian_form() -> None:
    # stages_table reads both dictionaries, so a label in both would print two ways across a page.
    differ = {label: (zero.TABLE_LABELS[label], zero.STAGES_LABELS[label])
              for label in zero.TABLE_LABELS.keys() & zero.STAGES_LABELS.keys()
              if zero.TABLE_LABELS[label] != zero.STAGES_LABELS[label]}
    assert not differ, differ


def test_lesson_78a_labels_name_one_quantity_one_way_where_the_peak_falls_and_a_link_s_rate():
    # The peak's breakdown calls "held" what the other tables of the page call "held between steps"
    # (bytes allocated before the step): one quantity, one Persian label. peak_in names a phase.
    labels = zero.STAGES_LABELS
    assert labels["held"] == labels["held between steps"]
    shown = zero.stages_table(pd.DataFrame({"peak_in": ["backward"]}, index=["ZeRO-3"]), "fa")
    assert shown.columns.tolist() == ["بیشینه در"]
    # A link's speed is a rate, as the prose writes it: «۴۰۰ گیگابیت بر ثانیه», not «۴۰۰ گیگابیتی».
    every = {**zero.TABLE_LABELS, **labels}.values()
    assert [label for label in every if "گیگابیتی" in label] == []


# Every Persian label the lessons' tables and figures showed, frozen when the course's shared
# terms moved into language.TERMS: English label -> the label shown.
FROZEN = json.loads(Path(__file__).with_name("persian_labels.json").read_text(encoding="utf-8"))
TABLE_FUNCTIONS = {"collectives.localized": collectives.localized, "ddp.localized": ddp.localized,
                   "zero.localized": zero.localized, "zero.stages_table": zero.stages_table,
                   "scale.table": scale.table, "pipeline.table": pipeline.table,
                   "checkpoint.table": checkpoint.table, "capstone.table": capstone.table}
FIGURE_MODULES = {"collectives": collectives, "ddp": ddp, "zero": zero, "scale": scale,
                  "pipeline": pipeline, "checkpoint": checkpoint, "capstone": capstone}


@pytest.mark.parametrize("name", sorted(TABLE_FUNCTIONS))
def test_every_persian_table_label_shows_as_it_did(name) -> None:
    labels = FROZEN[name]
    shown = TABLE_FUNCTIONS[name](pd.DataFrame([range(len(labels))], columns=list(labels)), "fa")
    changed = {label: (labels[label], str(persian)) for label, persian in zip(labels, shown.columns)
               if labels[label] != str(persian)}
    assert not changed, changed


def test_every_persian_figure_label_is_as_it_was() -> None:
    for name, labels in FROZEN.items():
        module, _, dictionary = name.partition(".")
        if dictionary.endswith("LABELS"):
            assert getattr(FIGURE_MODULES[module], dictionary)["fa"] == labels, name


TABLE_DICTIONARIES = {"TABLE_LABELS", "STAGES_LABELS", "TABLE_WORDS"}


def test_a_shared_term_is_written_once_in_language_terms() -> None:
    # A table dictionary of a lesson that repeats a shared term word for word would let the two
    # drift apart; it may still say a term its own way (checkpoint's "stage" is a save's stage).
    for module in FIGURE_MODULES.values():
        source = Path(module.__file__).read_text(encoding="utf-8")
        tables = [node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
                  and {getattr(target, "id", "") for target in node.targets} & TABLE_DICTIONARIES]
        pairs = {(key.value, value.value) for table in tables for node in ast.walk(table)
                 if isinstance(node, ast.Dict) for key, value in zip(node.keys, node.values)
                 if isinstance(key, ast.Constant) and isinstance(value, ast.Constant)}
        assert tables, module.__name__
        repeated = pairs & set(language.TERMS.items())
        assert not repeated, (module.__name__, sorted(repeated))


def test_lesson_78_network_seconds_are_the_traffics_and_its_rows_take_the_persian_comma():
    # The cell after the network table gives the passes' own lengths (backward of one sequence,
    # 0.43 s): the table's seconds are those of the traffic that falls in each pass, not a pass's.
    seconds = {english: persian for english, persian in zero.TABLE_LABELS.items()
               if english.startswith("s of traffic")}
    assert len(seconds) == 3 and all("ترافیک" in persian for persian in seconds.values()), seconds
    # The check against PyTorch names its rows "ZeRO-1, N=3": in Persian the comma is «،».
    rows = [f"ZeRO-1, N={n}" for n in (1, 2, 3, 4)] + ["ZeroRedundancyOptimizer, N=4"]
    shown = zero.localized(pd.DataFrame({"largest difference from torch.optim.Adam": 0.0},
                                        index=rows), "fa")
    assert [label for label in shown.index if "," in str(label)] == [], list(shown.index)
