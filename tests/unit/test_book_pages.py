"""The book's editions (lesson_code.book_build.pages): page pairs, Persian digits, the theme's strings."""

import re
from pathlib import Path

import pytest

from lesson_code.book_build import pages as book_pages

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(pytest.importorskip("sphinx").__file__).parents[1]  # site-packages of the book extra
THEMES = [SITE / "pydata_sphinx_theme" / "theme", SITE / "sphinx_book_theme" / "theme"]
# Strings the themes pass to _(), translate() or translation() with a literal argument: in their
# templates, and in sphinx-book-theme's Python for its buttons' tooltips.
CALL = re.compile(r"""\b(?:_|translate|translation)\(\s*(['"])(.+?)\1\s*\)""")


@pytest.mark.parametrize("docname, edition, other", [
    ("notebooks/fa/78-zero", "fa", "notebooks/en/78-zero"),
    ("notebooks/en/76-collectives", "en", "notebooks/fa/76-collectives"),
    ("fa/glossary", "fa", "en/glossary"),
    ("en/references", "en", "fa/references"),
    ("index", None, None),
    ("book/fa/glossary", None, None),
    ("search", None, None),
    ("notebooks/de/78-zero", None, None),
])
def test_each_page_has_its_edition_and_counterpart(docname, edition, other):
    assert book_pages.edition_of(docname) == edition
    assert book_pages.counterpart(docname) == other


def test_persian_digits():
    assert book_pages.persian_digits("4.19 s, 2026-12-03") == "۴٫۱۹ s, ۲۰۲۶-۱۲-۰۳"


def test_every_theme_string_of_the_templates_has_a_persian_translation():
    messages = book_pages.read_catalog(ROOT / "book" / book_pages.CATALOG)
    sources = [page for theme in THEMES for page in theme.rglob("*.html")]
    sources += list((SITE / "sphinx_book_theme").rglob("*.py"))
    used = {match[1] for page in sources for match in CALL.findall(page.read_text(encoding="utf-8"))}
    used.add("Contents")  # the table of contents' title, translate(theme_toc_title)
    assert {"Search", "Download notebook file", "next", "previous"} <= used, "the scan found too little"
    missing = sorted(used - set(messages))
    assert not missing, f"add these strings to book/{book_pages.CATALOG}: {missing}"
    assert all(re.search("[\u0600-\u06ff]", messages[m]) for m in used)


def test_the_translator_formats_and_falls_back_to_english():
    gettext = book_pages.translator({"Copyright %(copyright)s": "حق نشر %(copyright)s"})
    assert gettext("Copyright %(copyright)s", copyright="2026") == "حق نشر 2026"
    assert gettext("Untranslated") == "Untranslated"


def test_a_missing_catalog_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="theme.fa.po"):
        book_pages.read_catalog(tmp_path / "theme.fa.po")


def test_the_run_box_of_a_persian_lesson_quotes_its_time_in_persian_digits():
    times = {"fa/78-zero.ipynb": {"notebook": "fa/78-zero.ipynb", "seconds": "27",
                                  "machine": "Linux x86_64, 2 CPUs", "date": "2026-12-03"}}
    box = book_pages.run_box("notebooks/fa/78-zero", times, lambda target, resource: target)
    assert box["download"] == "_sources/notebooks/fa/78-zero.ipynb"
    assert box["folder"] == "notebooks/fa" and box["file"] == "78-zero.ipynb"
    assert box["measured"]["seconds"] == "۲۷" and box["measured"]["date"] == "۲۰۲۶-۱۲-۰۳"
    assert box["measured"]["system"] == "Linux\u00a0x86_64" and box["measured"]["cpus"] == "۲"
    times["fa/78-zero.ipynb"]["machine"] = "a machine of another form"
    other = book_pages.run_box("notebooks/fa/78-zero", times, lambda target, resource: target)
    assert other["measured"]["system"] == "a machine of another form" and other["measured"]["cpus"] is None
    times["fa/78-zero.ipynb"]["machine"] = "16 CPUs"  # no system named: the line as it is
    assert book_pages.run_box("notebooks/fa/78-zero", times, lambda t, r: t)["measured"]["system"] == "16 CPUs"
    assert book_pages.run_box("notebooks/en/78-zero", times, lambda t, r: t)["measured"] is None
    assert book_pages.run_box("fa/intro", times, lambda t, r: t) is None


def test_the_readme_runs_a_lesson_as_the_run_box_does():
    """The README's command for running a lesson without a browser, in both of its languages,
    is the lesson page's, and says where the executed notebook goes (into the ignored _build/)."""
    box = book_pages.run_box("notebooks/en/78-zero", {}, lambda target, resource: target)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    english, persian = readme.split("\n## فارسی\n")
    for text in (english, persian):
        assert f"`{box['execute']}`" in text and f"`{box['executed']}`" in text
    assert box["executed"].startswith("_build/") and "_build/" in (ROOT / ".gitignore").read_text()


def test_the_jupyterlab_wrappers_leave_the_persian_doctree_and_nothing_else():
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    document = new_document("fa", get_default_settings(Parser))
    section = nodes.section("", nodes.title("", "عنوان"), nodes.paragraph("", "متن"))
    document += [nodes.raw("", '<div dir="rtl">\n', format="html"), section]
    section += nodes.raw("", "</div>", format="html")
    document += nodes.raw("", "</div>", format="html")  # no wrapper before it: someone's own HTML
    document += nodes.raw("", '<div dir="rtl">', format="latex")  # not HTML
    assert book_pages.remove_rtl_wrappers(document) == 2
    left = [(r["format"], r.astext()) for r in document.findall(nodes.raw)]
    assert left == [("html", "</div>"), ("latex", '<div dir="rtl">')]
    assert section.parent is document and len(section) == 2


def test_an_inline_script_registered_twice_is_kept_once():
    from sphinx.builders.html._assets import _JavaScript

    thebe = 'const THEBE_JS_URL = "x"'
    scripts = [_JavaScript("_static/", body=thebe), _JavaScript("_static/doctools.js"),
               _JavaScript(None, body=thebe), _JavaScript("_static/editions.js", defer="defer")]
    kept = book_pages.unique_scripts(scripts)
    assert kept == [scripts[0], scripts[1], scripts[3]]
