"""The glossaries hold every term the lessons send the reader to, and the two editions agree.

A lesson links a term to the glossary in two ways: the `{term}` role, or a line of its key terms
that names terms in bold and links the glossary page with `{doc}`. Each such term must be an entry
(or an alias of one) in the glossary of the lesson's language, or the reader follows a link to
nothing. The English and Persian glossaries hold the same entries in the same order: the English
entry names its Persian term ("Persian: ..."), the Persian entry its English one ("انگلیسی: ...").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
LANGS = ("en", "fa")
BOLD = re.compile(r"\*\*(.+?)\*\*")
TERM_ROLE = re.compile(r"\{term\}`(?:[^`<]*<([^`>]+)>|([^`<]+))`")
GLOSSARY_LINK = re.compile(r"\{doc\}`[^`]*glossary[^`]*`")
OTHER_NAME = {"en": re.compile(r"^Persian:\s*(.+?)\.?$"), "fa": re.compile(r"^انگلیسی:\s*(.+?)\.?$")}


def normal(term: str) -> str:
    """A term as entries and links are compared: no code marks or call parentheses, one case."""
    return re.sub(r"\s+", " ", term.replace("`", "").removesuffix("()")).strip().casefold()


def parse_glossary(text: str, lang: str) -> list[dict]:
    """Entries of the ```{glossary} block: their names (aliases included) and the other
    language's names from their first line, in order."""
    block = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    entries, names = [], []
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            names.append(line.strip())
            continue
        if names:  # the first indented line after the names: the other language's names
            found = OTHER_NAME[lang].match(line.strip())
            other = [part.strip(" `") for part in re.split(r"[،,]", found.group(1))] if found else []
            entries.append({"names": names, "other": other})
            names = []
    return entries


def glossary(lang: str, text: str | None = None) -> list[dict]:
    """The entries of book/<lang>/glossary.md (or of `text`, a copy of it)."""
    text = text if text is not None else (ROOT / "book" / lang / "glossary.md").read_text()
    return parse_glossary(text, lang)


def linked_terms(markdown: str) -> list[str]:
    """Terms `markdown` links to the glossary: `{term}` roles, and bold terms on a line that
    links the glossary page."""
    terms = [a or b for a, b in TERM_ROLE.findall(markdown)]
    for line in markdown.splitlines():
        if GLOSSARY_LINK.search(line):
            terms += BOLD.findall(line)
    return terms


def missing_links(notebook: dict, entries: list[dict]) -> list[str]:
    """Linked terms of `notebook` that no entry of `entries` names, with their cell ids."""
    known = {normal(name) for entry in entries for name in entry["names"]}
    return [f"cell {cell.get('id')}: {term!r}"
            for cell in notebook["cells"] if cell["cell_type"] == "markdown"
            for term in linked_terms("".join(cell["source"])) if normal(term) not in known]


def out_of_step(en: list[dict], fa: list[dict]) -> list[str]:
    """Where the two glossaries disagree: entry counts, or an entry whose names do not match."""
    problems = [] if len(en) == len(fa) else [f"en has {len(en)} entries, fa has {len(fa)}"]
    for index, (e, f) in enumerate(zip(en, fa)):
        if normal(e["names"][0]) not in map(normal, f["other"]) or \
                normal(f["names"][0]) not in map(normal, e["other"]):
            problems.append(f"entry {index}: en {e['names']} (Persian {e['other']}) and fa "
                            f"{f['names']} (English {f['other']}) do not name each other")
    return problems


def lessons(lang: str) -> list[Path]:
    return sorted((ROOT / "notebooks" / lang).glob("*.ipynb"))


@pytest.mark.parametrize("path", [p for lang in LANGS for p in lessons(lang)],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_glossary_link_has_an_entry(path: Path) -> None:
    lang = path.parent.name
    missing = missing_links(json.loads(path.read_text()), glossary(lang))
    assert not missing, f"{path.relative_to(ROOT)} links terms book/{lang}/glossary.md lacks: {missing}"


def test_glossaries_hold_the_same_entries_in_step() -> None:
    en, fa = glossary("en"), glossary("fa")
    assert len(en) > 50
    assert not out_of_step(en, fa), "\n".join(out_of_step(en, fa))


# --- The checks themselves can fail -------------------------------------------------------------

def _without_entry(lang: str, name: str) -> str:
    """A copy of the glossary of `lang` with the entry called `name` removed."""
    text = (ROOT / "book" / lang / "glossary.md").read_text()
    pattern = re.compile(rf"\n{re.escape(name)}\n(?:\S.*\n)*(?:  .*\n)+")
    broken, count = pattern.subn("\n", text)
    assert count == 1, f"no entry {name!r} in book/{lang}/glossary.md"
    return broken


@pytest.mark.parametrize("lang, entry, lesson", [
    ("en", "composition", "81-capstone.ipynb"),
    ("fa", "ترکیب", "81-capstone.ipynb"),
    ("en", "broadcast", "77-ddp.ipynb"),
])
def test_a_removed_entry_is_reported(lang: str, entry: str, lesson: str) -> None:
    notebook = json.loads((ROOT / "notebooks" / lang / lesson).read_text())
    broken = glossary(lang, _without_entry(lang, entry))
    assert any(repr(entry) in problem for problem in missing_links(notebook, broken))


def test_glossaries_out_of_step_are_reported() -> None:
    en, fa = glossary("en"), glossary("fa")
    assert out_of_step(en, glossary("fa", _without_entry("fa", "ترکیب")))
    assert out_of_step(en, fa[1:] + fa[:1])


def test_term_roles_and_glossary_lines_are_read() -> None:
    markdown = ("See {term}`rank` and {term}`the ring <ring>`.\n"
                "- **shard**, **`no_sync()`**: see the {doc}`glossary </en/glossary>`.\n"
                "- **not linked**: plain text.")
    assert linked_terms(markdown) == ["rank", "ring", "shard", "`no_sync()`"]


def shared_names(en: list[dict], fa: list[dict]) -> set[str]:
    """Term names that both glossaries define (Sphinx keeps one term table for the whole book)."""
    def names(entries: list[dict]) -> set[str]:
        return {normal(name) for entry in entries for name in entry["names"]}
    return names(en) & names(fa)


def test_no_term_is_defined_in_both_glossaries() -> None:
    # Sphinx's terms are global, so a name in both glossaries is a duplicate-term warning (-W fails)
    assert shared_names(glossary("en"), glossary("fa")) == set()


def test_a_name_in_both_glossaries_is_found() -> None:
    en = [{"names": ["GPipe"], "other": ["GPipe"]}]
    assert shared_names(en, [{"names": ["gpipe"], "other": ["GPipe"]}]) == {normal("GPipe")}


def names_defined_twice(entries: list[dict]) -> list[str]:
    """Term names that two entries of one glossary define (a duplicate-term warning, as above)."""
    seen: set[str] = set()
    twice = []
    for name in (normal(name) for entry in entries for name in entry["names"]):
        if name in seen:
            twice.append(name)
        seen.add(name)
    return twice


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_no_glossary_defines_a_term_twice(lang: str) -> None:
    assert names_defined_twice(glossary(lang)) == []


def test_a_term_defined_twice_is_found() -> None:
    entry = {"names": ["gradient clipping"], "other": ["بریدن گرادیان"]}
    assert names_defined_twice([entry, {"names": ["GPipe"], "other": []}, entry]) == [
        normal("gradient clipping")]
