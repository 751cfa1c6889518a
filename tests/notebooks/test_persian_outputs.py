"""What the Persian notebooks print is Persian: every stored output of notebooks/fa/*.ipynb.

A reader of the Persian edition reads the cells' outputs as much as the prose: the tables, the
lines a cell prints, the words drawn in a figure, an error, a widget's labels. This test reads
each of them as a reader's viewer shows it and fails on an English word, naming the notebook,
the cell id and the words:

- streams (what a cell prints) and error messages (the exception's name is code; its message
  is read);
- a rich output as it is shown: its HTML when it has one (a table: the text of its cells,
  outside <code>), else its SVG figure (matplotlib draws each text as paths, but writes the
  text itself in an XML comment before the glyphs: those comments are read), else its text;
- a widget: the labels, options and outputs of it and its children, from the widget state the
  notebook stores.

Allowed are what a Persian technical text writes in Latin letters (ALLOWED and `is_code`):
identifiers and file names (anything with a digit, _, ., /, =, or a quoted identifier such as
a dict's 'step'), code in a left-to-right isolate (U+2066 ... U+2069) in plain text and in
<code> in HTML, names in CamelCase or capitals (ZeroRedundancyOptimizer, NCCL, SIGKILL),
single letters of a formula (P, m, N), units, and a short list of proper names and code names
written in lower case (gloo, torch, Adam, fsync). An English word, let alone a sentence, fails.
Numbers beside Persian words must follow lesson_code.language's rule: Persian digits, the minus
sign rather than a hyphen, «× ۱۰⁻⁶» rather than a Latin «e». A printed Persian line marks code
with an isolate, never with Markdown's backticks, which plain text shows as they are.

Run alone: pytest tests/notebooks/test_persian_outputs.py (or -m persian_outputs).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.persian_outputs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks" / "fa").glob("*.ipynb"))

# Proper names, code names and units written in lower case or capitalised like a word: the
# short list a Persian technical text keeps in Latin letters. Everything else that looks like an
# English word is one.
PROPER_NAMES = {"Adam", "Python", "Linux", "Jupyter", "Colab", "Megatron", "DeepSpeed"}
CODE_NAMES = {"gloo", "nccl", "torch", "torchrun", "fsync", "lesson_code", "auto", "NaN"}
UNITS = {"ms", "us", "µs", "s", "B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB", "bf16",
         "fp16", "fp32"}
ALLOWED = PROPER_NAMES | CODE_NAMES | UNITS

QUOTED_IDENTIFIER = re.compile(r"""(['"])[A-Za-z_][A-Za-z0-9_]*\1""")  # a dict key: 'step'
BACKTICKED = re.compile(r"`[^`\n]+`")  # Markdown's code: a notebook's own text, not an output
ISOLATE = re.compile("\u2066[^\u2069]*\u2069")  # a name, a command or a formula, left to right
CODE_MARK = re.compile(r"[\d_./=\\@$<>|{}]|\w\(")  # digits, paths, assignments, calls
INNER_CAPITAL = re.compile(r"[a-z][A-Z]|[A-Z]{2}")  # CamelCase, ZeRO, an acronym
LATIN = re.compile(r"[A-Za-z]")
CHUNK_EDGES = " \t\n()[]{},;:!?\"'`«»“”‘’*#…\u200c\u200e\u200f\u2066\u2067\u2068\u2069"
WORD = re.compile(r"[A-Za-zµ]+")


def is_code(chunk: str) -> bool:
    """A chunk (text between spaces) that is code, a name or a unit, not an English word."""
    return bool(CODE_MARK.search(chunk) or INNER_CAPITAL.search(chunk) or chunk in ALLOWED)


def english_words(text: str) -> list[str]:
    """The English words of `text`: Latin words that are not code (in a left-to-right isolate,
    the way a Persian line marks code, or in backticks), names, units or a formula's single
    letters."""
    found = []
    text = ISOLATE.sub(" ", BACKTICKED.sub(" ", QUOTED_IDENTIFIER.sub(" ", text)))
    for chunk in re.split(r"[\s،؛]+", text):
        chunk = chunk.strip(CHUNK_EDGES)
        if not LATIN.search(chunk) or is_code(chunk):
            continue
        found += [word for word in WORD.findall(chunk) if len(word) > 1 and word not in ALLOWED
                  and not word.isupper()]
    return found


PERSIAN_LETTER = re.compile(r"[\u0600-\u065f\u066e-\u06ef\u06fa-\u06ff]")
LATIN_NUMBER = re.compile(r"[-+]?[0-9][0-9,]*(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?%?")
SCIENTIFIC_E = re.compile(r"[۰-۹٫]e[-+]?[۰-۹]")  # ۳٫۸۱۴۶۹۷e-۰۶
HYPHEN_MINUS = re.compile(r"(?<![\w\-])-(?=[۰-۹])")  # -۰٫۴ with a hyphen, not the minus sign



def number_problems(text: str, whole: bool = False) -> list[str]:
    """Numbers of Persian text not written by the course's rule (lesson_code.language): a Latin
    'e' exponent, a hyphen for the minus sign, a number in Latin digits beside Persian words
    (on the same line, or anywhere in a `whole` Persian table), outside code and formulas."""
    found = []
    text = ISOLATE.sub(" ", BACKTICKED.sub(" ", text))
    persian = whole and PERSIAN_LETTER.search(text)
    for line in text.splitlines():
        if not (persian or PERSIAN_LETTER.search(line)):
            continue
        found += [f"'{m.group()}...'" for m in SCIENTIFIC_E.finditer(line)]
        found += [f"hyphen in '{line[m.start():m.start() + 5]}'" for m in HYPHEN_MINUS.finditer(line)]
        found += [chunk for chunk in (c.strip(CHUNK_EDGES) for c in re.split(r"[\s،؛]+", line))
                  if LATIN_NUMBER.fullmatch(chunk)]
    return found


def backticked_lines(text: str) -> list[str]:
    """The Persian lines of printed text that wrap code in backticks: a terminal or a notebook
    shows them as they are, so a Persian line isolates its code instead (language.isolated_code).
    Latin lines (a traceback, code's own output) may hold backticks."""
    return [line[max(0, line.index("`") - 30):][:70].strip() for line in text.splitlines()
            if "`" in line and PERSIAN_LETTER.search(line)]


class _Text:
    """The text of HTML as a reader sees it: no <style> or <script>, no code (<code>)."""

    SKIPPED = re.compile(r"<(style|script|code)\b[^>]*>.*?</\1>", re.S | re.I)
    TAG = re.compile(r"<[^>]+>")

    @classmethod
    def of(cls, markup: str) -> str:
        return html.unescape(cls.TAG.sub(" ", cls.SKIPPED.sub(" ", markup)))


def svg_texts(svg: str) -> str:
    """The words a matplotlib SVG draws: the comment it writes before each text's glyphs."""
    return "\n".join(html.unescape(c) for c in re.findall(r"<!-- (.*?) -->", svg, re.S)
                     if not c.startswith("Created with"))


def widget_texts(model_id: str, state: dict, seen: set | None = None) -> list[str]:
    """Labels, options and outputs of a stored widget and of its children."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return []
    seen.add(model_id)
    model = state[model_id].get("state", {})
    texts = [model[key] for key in ("description", "placeholder", "tooltip")
             if isinstance(model.get(key), str)]
    texts += [str(label) for label in model.get("_options_labels", [])]
    if model.get("_model_name") in ("LabelModel", "HTMLModel", "HTMLMathModel", "TextModel"):
        texts.append(_Text.of(str(model.get("value", ""))))
    for output in model.get("outputs", []):
        texts += [text for _, text in output_texts(output, state)]
    for child in model.get("children", []):
        texts += widget_texts(str(child).removeprefix("IPY_MODEL_"), state, seen)
    return texts


def output_texts(output: dict, state: dict) -> list[tuple[str, str]]:
    """(what, text) for each text a reader sees of one output."""
    kind = output["output_type"]
    if kind == "stream":
        return [(f"stream {output.get('name', '')}".strip(), "".join(output["text"]))]
    if kind == "error":
        return [("error message", output.get("evalue", ""))]
    data = output.get("data", {})
    joined = {key: "".join(value) if isinstance(value, list) else value for key, value in data.items()}
    widget = joined.get("application/vnd.jupyter.widget-view+json")
    if widget and widget.get("model_id") in state:
        return [("widget", text) for text in widget_texts(widget["model_id"], state)]
    if "text/html" in joined:
        return [("table or HTML", _Text.of(joined["text/html"]))]
    if "image/svg+xml" in joined:
        return [("figure", svg_texts(joined["image/svg+xml"]))]
    if "text/markdown" in joined:
        return [("markdown", joined["text/markdown"])]
    if "text/plain" in joined:
        return [("text", joined["text/plain"])]
    return []


def findings(notebook: dict) -> list[str]:
    """One line per output that shows English: the cell's id, what it is, the words."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    found = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        for output in cell.get("outputs", []):
            for what, text in output_texts(output, state):
                words = english_words(text)
                numbers = number_problems(text, whole=what == "table or HTML")
                backticks = backticked_lines(text) if what.startswith(("stream", "error")) else []
                if words:
                    found.append(f"cell {cell.get('id')} ({what}): "
                                 + ", ".join(sorted(set(words), key=words.index)))
                if numbers:
                    found.append(f"cell {cell.get('id')} ({what}), numbers not by the rule: "
                                 + ", ".join(sorted(set(numbers), key=numbers.index)))
                if backticks:
                    found.append(f"cell {cell.get('id')} ({what}), code in backticks rather "
                                 "than isolated: " + " | ".join(backticks))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_output_of_a_persian_notebook_is_persian(path):
    found = findings(json.loads(path.read_text(encoding="utf-8")))
    assert not found, (f"notebooks/fa/{path.name}: {len(found)} outputs show English words or "
                       "numbers not written the Persian way:\n"
                       + "\n".join(found))


# --- The checker itself ----------------------------------------------------------------------

def test_an_english_sentence_fails_and_code_names_units_and_persian_pass():
    assert english_words("rank 1 of 4 was killed by SIGKILL before returning a result") == [
        "rank", "of", "was", "killed", "by", "before", "returning", "result"]
    assert english_words("lesson 77 benchmark: MiniGPT with 4,788,224 parameters") == [
        "lesson", "benchmark", "with", "parameters"]
    persian = ("رتبهٔ ۱ از ۴ با SIGKILL کشته شد؛ فایل .step-00000002.tmp/.owner و "
               "torch.optim.Adam و ZeroRedundancyOptimizer روی gloo، ۱۲ MB/s، ۳ ms، P = ۴، "
               "{'step': 10, 'world_size': 4} با Adam و NCCL")
    assert english_words(persian) == []
    assert english_words("{'latest complete': 'step-00000002'}") == ["latest", "complete"]
    assert english_words("naive bucketed torch") == ["naive", "bucketed"]
    assert english_words("با فرمان `python -m lesson_code.bench pipeline` اندازه‌گیری شد") == []
    assert english_words("با فرمان \u2066python -m lesson_code.bench pipeline\u2069 اندازه‌گیری شد") == []


def test_a_printed_persian_line_isolates_code_instead_of_backticks():
    assert backticked_lines("انتخاب `auto` برای باکتی ۴ MiB") == ["انتخاب `auto` برای باکتی ۴ MiB"]
    assert backticked_lines("انتخاب \u2066auto\u2069 برای باکتی ۴ MiB") == []
    assert backticked_lines("ValueError: use `n` > 0\nرتبهٔ ۱") == []  # a Latin line: code's own
    notebook = {"cells": [{"cell_type": "code", "id": "c1", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["انتخاب `auto`: \u2066ring\u2069\n"]}]}]}
    assert findings(notebook) == [
        "cell c1 (stream stdout), code in backticks rather than isolated: انتخاب `auto`: \u2066ring\u2069"]


def test_numbers_beside_persian_words_follow_the_rule():
    assert number_problems("بیشینه ۳٫۸۱۴۶۹۷e-۰۶ و -۰٫۴ و عنصرهای 0 تا 7519") == [
        "'۷e-۰...'", "hyphen in '-۰٫۴ '", "0", "7519"]
    assert number_problems("بیشینه ⁦۳٫۸۱ × ۱۰⁻⁶⁩ و ⁦−۰٫۴⁩، فایل shard-00001-of-00004.pt") == []
    assert number_problems("[3, 3, 2, 2]") == []  # no Persian on the line: code's output
    assert number_problems("مرحله\n3.5\n۳٫۸۱۴۶۹۷e-۰۶", whole=True) == ["3.5", "'۷e-۰...'"]
    assert number_problems("\u200f\u2066(P − 1)/(m + P − 1)\u2069، P = ۲") == []  # a formula


def test_every_kind_of_output_is_read():
    svg = '<svg><!-- Created with matplotlib --><g><!-- ring all_reduce --></g></svg>'
    table = '<div><style>.x {color: red}</style><table><tr><td>naive</td><td><code>x</code></td></tr></table></div>'
    state = {"a": {"state": {"_model_name": "VBoxModel", "children": ["IPY_MODEL_b"]}},
             "b": {"state": {"_model_name": "FloatSliderModel", "description": "P (billions)"}}}
    notebook = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": state}}},
                "cells": [{"cell_type": "code", "id": "c1", "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": ["measured on rank 0\n"]},
                    {"output_type": "error", "ename": "ValueError", "evalue": "use a divisor",
                     "traceback": []},
                    {"output_type": "display_data", "data": {"image/svg+xml": svg,
                                                             "text/plain": "<Figure>"}},
                    {"output_type": "execute_result", "data": {"text/html": table,
                                                               "text/plain": "ignored words"}},
                    {"output_type": "display_data", "data": {
                        "application/vnd.jupyter.widget-view+json": {"model_id": "a"},
                        "text/plain": "interactive(...)"}}]}]}
    assert findings(notebook) == ["cell c1 (stream stdout): measured, on, rank",
                                  "cell c1 (error message): use, divisor",
                                  "cell c1 (figure): ring", "cell c1 (table or HTML): naive",
                                  "cell c1 (widget): billions"]


# --- Code the Persian prose quotes -----------------------------------------------------------

FENCE = re.compile(r"^\s*```(\S*)")


def unisolated_comments(markdown: str) -> list[str]:
    """The lines of `markdown`'s code blocks (not its plain-text blocks, which read line by line
    in their own direction) whose comment holds Persian outside a right-to-left isolate
    (U+2067 ... U+2069). A code block runs left to right, so a comment such as «# gloo: تا t ...»
    would show its Persian and Latin runs in the wrong order; isolated, it reads as written."""
    found, language = [], None
    for line in markdown.splitlines():
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        if language not in (None, "text") and "#" in line:
            comment = line[line.index("#") + 1:].strip()
            if PERSIAN_LETTER.search(comment) and not (comment.startswith("\u2067")
                                                      and comment.endswith("\u2069")):
                found.append(line)
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_a_persian_comment_in_quoted_code_reads_right_to_left(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    found = [f"cell {cell.get('id')}: {line}" for cell in cells
             if cell["cell_type"] == "markdown" and "listing" not in cell.get("metadata", {})
             for line in unisolated_comments("".join(cell["source"]))]
    assert not found, (f"notebooks/fa/{path.name}: wrap each Persian comment of a code block in "
                       "U+2067 ... U+2069:\n" + "\n".join(found))


def test_an_unisolated_persian_comment_is_found_and_an_isolated_one_is_not():
    block = ("```python\ndist.all_reduce(t)  # درجا: حاصل‌جمع روی هر رتبه\n"
             "work.wait()  # \u2067gloo: تا t منتظر می‌ماند\u2069\nx = 1  # in place\n```\n"
             "```text\n\u200f۱. [قبول] فایل import می‌شود  # نه یک توضیح\n```")
    assert unisolated_comments(block) == ["dist.all_reduce(t)  # درجا: حاصل‌جمع روی هر رتبه"]
    assert unisolated_comments("# عنوانی بیرون از کد") == []


# A Persian clause's colon (or comma) inside a Latin name's left-to-right isolate shows on the
# name's far side («کل مرحلهGPipe :»): plots.tables keeps it outside, and a stored table made
# before that rule, or by other code, is found here.
COLON_IN_ISOLATE = re.compile(r'<bdi dir="ltr">[0-9\u06f0-\u06f9]*[:;,،]\s')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_stored_persian_table_isolates_a_clauses_colon_with_a_name(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    found = [f"cell {cell.get('id')}: {match.group()}…" for cell in cells
             if cell["cell_type"] == "code" for output in cell.get("outputs", [])
             for match in COLON_IN_ISOLATE.finditer(
                 "".join(output.get("data", {}).get("text/html", "")))]
    assert not found, (f"notebooks/fa/{path.name}: re-execute it (plots.tables keeps a clause's "
                       "colon outside a name's isolate):\n" + "\n".join(found))
