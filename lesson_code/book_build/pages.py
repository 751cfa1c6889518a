"""The book's two editions, for the Jupyter Book build: a Sphinx extension, not a lesson.

_config.yml loads it (sphinx.extra_extensions), so `jupyter-book build book` runs it. The source
folder is book/: its pages are fa/intro, en/glossary, ... and the lessons notebooks/fa/78-zero,
notebooks/en/78-zero (book/notebooks links to notebooks/). For every page it decides the edition
(Persian: fa/ and notebooks/fa/; English: en/ and notebooks/en/) and gives
book/_templates/layout.html what the page needs:

- `edition`: lang and dir of the page, the same page in the other edition (the language switch and
  the <link rel="alternate" hreflang> tags), and on Persian pages the theme's strings in Persian
  from book/_templates/theme.fa.po (the themes ship no Persian translation);
- `run_lesson` on lesson pages: how to run the notebook (in JupyterLab, or without a browser into
  _build/executed), how long its last run took (from the
  CSV that `make notebooks` writes, read by lesson_code.book_build.run_times) and where to download it;
- `explorer_scripts` on lesson pages: the scripts of the lesson's offline explorers in
  book/static (EXPLORERS), each filling the page's <div class="explorer" data-explorer="NN">
  (lesson 78's memory calculator places itself after the cell of its notebook widget), and
  `explorer_data`, the measured constants they read (lesson_code.book_build.explorer_data).

Before any page is read it puts the notebooks' stored outputs into the execution cache where
they come from a run of exactly their current code (lesson_code.book_build.cache), so that the build
runs only the lessons edited since. After the build it writes dir="rtl" into the <html> tag of
Persian pages (the theme builds that tag itself, so no template can add an attribute to it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lesson_code.book_build import cache as book_cache
from lesson_code.book_build import explorer_data
from lesson_code.book_build import run_times

CATALOG = "_templates/theme.fa.po"  # relative to the source folder, book/
EDITIONS = ("fa", "en")
LESSONS = "notebooks"  # the folder of the lesson pages, inside the source folder
EXECUTED = "_build/executed"  # where the run box's command writes an executed lesson
DIRECTION = {"fa": "rtl", "en": "ltr"}
LANGUAGE_NAME = {"fa": "فارسی", "en": "English"}
PERSIAN_DIGITS = str.maketrans("0123456789.", "۰۱۲۳۴۵۶۷۸۹٫")
# Each lesson's offline explorers, the scripts its page loads from book/static, in order.
EXPLORERS = {
    # lesson 78a's step explorer shares the calculator's file (its formulas); both pages load the
    # explorers' helpers (lesson 78's calculator writes the scale lab's measured points with them)
    "78-zero": ("explorer-common.js", "memory-calculator.js"),
    "78a-zero-stages": ("explorer-common.js", "memory-calculator.js"),
    "76-collectives": ("explorer-common.js", "explorer-76.js"),
    "77-ddp": ("explorer-common.js", "explorer-77.js"),
    "79-pipeline": ("explorer-common.js", "explorer-79.js"),
    "80-checkpoint": ("explorer-common.js", "explorer-80.js"),
    "81-capstone": ("explorer-common.js", "explorer-81.js"),
}
# How Persian notebooks wrap their prose for JupyterLab, which has no right-to-left setting:
# <div dir="rtl"> on the cell's first line, </div> on its last, each followed by a blank line.
RTL_OPEN = re.compile(r'^<div dir="rtl">$')
RTL_CLOSE = re.compile(r"^</div>$")


def _split(docname: str) -> tuple[str, str, str] | None:
    """(folder, edition, name) of a page of one edition: ("", "fa", "intro") for fa/intro,
    ("notebooks", "en", "78-zero") for notebooks/en/78-zero; None for any other page."""
    parts = docname.split("/")
    if len(parts) == 2 and parts[0] in EDITIONS:
        return "", parts[0], parts[1]
    if len(parts) == 3 and parts[0] == LESSONS and parts[1] in EDITIONS:
        return parts[0], parts[1], parts[2]
    return None


def edition_of(docname: str) -> str | None:
    """"fa" or "en" for a page of one edition (fa/intro, notebooks/en/78-zero), else None."""
    split = _split(docname)
    return split and split[1]


def counterpart(docname: str) -> str | None:
    """The same page in the other edition (notebooks/fa/X <-> notebooks/en/X), or None."""
    split = _split(docname)
    if split is None:
        return None
    folder, edition, name = split
    other = "en" if edition == "fa" else "fa"
    return "/".join(part for part in (folder, other, name) if part)


def persian_digits(text: str) -> str:
    """`text` with Western digits (and the decimal point) written as Persian ones."""
    return str(text).translate(PERSIAN_DIGITS)


def read_catalog(path: Path) -> dict[str, str]:
    """English message -> Persian translation, from a gettext .po file (empty ones left out)."""
    from babel.messages.pofile import read_po

    if not path.is_file():
        raise FileNotFoundError(f"the Persian catalog {path} is missing: restore it from git")
    with path.open("rb") as handle:
        catalog = read_po(handle)
    return {m.id: m.string for m in catalog if m.id and isinstance(m.id, str) and m.string}


def translator(messages: dict[str, str]):
    """A gettext function for templates: the Persian string, else the English one unchanged."""

    def gettext(message: str, *args, **kwargs) -> str:
        text = messages.get(message, message)
        return text % kwargs if kwargs else text

    return gettext


def run_box(docname: str, times: dict[str, dict], pathto) -> dict | None:
    """What the "Run this lesson" box of a lesson page says, or None on other pages.

    `execute` runs the lesson without a browser, from the repository root, in the notebook's
    folder as JupyterLab does, and writes the notebook with its outputs to `executed`, inside
    the git-ignored _build/: the lesson's own file, and the checkout, stay as they were.
    """
    folder, edition, name = _split(docname) or ("", "", "")
    if folder != LESSONS:
        return None
    notebook = f"{edition}/{name}.ipynb"
    measured = times.get(notebook)
    box = {"folder": f"notebooks/{edition}", "file": f"{name}.ipynb",
           "execute": (f".venv/bin/jupyter nbconvert --to notebook --execute --output-dir "
                       f"{EXECUTED}/{edition} notebooks/{notebook}"),
           "executed": f"{EXECUTED}/{notebook}",
           "download": pathto(f"_sources/notebooks/{notebook}", 1), "measured": measured}
    if measured and edition == "fa":
        # run_times.machine()'s "Linux x86_64, 2 CPUs" as the Persian box says it: the system
        # left to right and unbroken (a no-break space), then «۲ پردازنده» (os.cpu_count's
        # logical CPUs, not cores) in the sentence's own direction, so that a narrow screen
        # never wraps a Latin comma into the Persian line (a line in another form stays as it
        # is, free to wrap).
        parts = run_times.machine_parts(measured["machine"])
        box["measured"] = {**measured, "seconds": persian_digits(measured["seconds"]),
                           "date": persian_digits(measured["date"]),
                           "system": parts[0].replace(" ", "\u00a0") if parts else measured["machine"],
                           "cpus": persian_digits(parts[1]) if parts else None}
    return box


def unique_scripts(scripts: list) -> list:
    """`scripts` (Sphinx's script_files) with each inline script's body kept once.

    The pinned sphinx-thebe and sphinx-togglebutton register their inline scripts twice (once
    with the file name '_static/', once with None, so Sphinx's own check misses the copy), and a
    second `const THEBE_JS_URL` is a SyntaxError in the console of every page.
    """
    seen, kept = set(), []
    for script in scripts:
        body = script.attributes.get("body")
        if body is None or body not in seen:
            kept.append(script)
        if body is not None:
            seen.add(body)
    return kept


def page_context(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """html-page-context: the edition, its switch, its strings and the lesson's run box."""
    edition = edition_of(pagename)
    other = counterpart(pagename)
    if other is not None and other not in app.env.all_docs:
        other = None
    context["edition"] = {
        "lang": edition or "en", "dir": DIRECTION[edition or "en"], "persian": edition == "fa",
        "href": pagename.rsplit("/", 1)[-1] + ".html",
        "other": other and {"lang": edition_of(other), "name": LANGUAGE_NAME[edition_of(other)],
                            "href": context["pathto"](other)},
    }
    context["language"] = edition or "en"
    context["script_files"] = unique_scripts(context.get("script_files", []))
    messages = app.config.book_fa_messages
    if edition == "fa":
        gettext = translator(messages)
        context.update(_=gettext, gettext=gettext, translate=gettext,
                       ngettext=lambda one, many, n: gettext(one if n == 1 else many) % {"num": n},
                       theme_search_bar_text=gettext("Search this book..."))
    if pagename == "search":
        context["edition_messages"] = json.dumps(messages, ensure_ascii=False)
    context["run_lesson"] = run_box(pagename, app.config.book_run_times, context["pathto"])
    lesson = pagename.rsplit("/", 1)[-1] if edition_of(pagename) else ""
    context["explorer_scripts"] = EXPLORERS.get(lesson, ())
    data = explorer_data.for_lesson(lesson)
    context["explorer_data"] = json.dumps(data, ensure_ascii=False) if data else None


def remove_rtl_wrappers(doctree) -> int:
    """Remove each <div dir="rtl"> raw HTML node and the next </div> after it; their count.

    Persian notebooks wrap their prose so for JupyterLab, which has no right-to-left setting.
    The book sets Persian pages right-to-left from one rule (book/static/rtl.css), and a kept
    </div> would close the section that a heading inside the wrapper opened. A </div> with no
    wrapper before it is left alone.
    """
    from docutils import nodes

    removed, open_wrapper = 0, False
    for raw in list(doctree.findall(nodes.raw)):
        text = raw.astext().strip()
        opens, closes = bool(RTL_OPEN.match(text)), bool(RTL_CLOSE.match(text))
        if "html" in raw.get("format", "") and (opens or (closes and open_wrapper)):
            open_wrapper = opens
            raw.parent.remove(raw)
            removed += 1
    return removed


def drop_rtl_wrappers(app, doctree) -> None:
    """doctree-read: remove the JupyterLab wrappers from the Persian pages (remove_rtl_wrappers)."""
    if edition_of(app.env.docname) == "fa":
        remove_rtl_wrappers(doctree)


def mark_rtl(app, exception) -> None:
    """build-finished: <html lang="fa"> becomes <html lang="fa" dir="rtl"> on Persian pages."""
    if exception is not None or app.builder.format != "html":
        return
    for docname in sorted(app.env.found_docs):
        page = Path(app.outdir) / f"{docname}.html"
        if edition_of(docname) != "fa" or not page.is_file():
            continue
        html = page.read_text(encoding="utf-8")
        if '<html lang="fa" dir="rtl"' not in html:
            page.write_text(html.replace('<html lang="fa"', '<html lang="fa" dir="rtl"', 1),
                            encoding="utf-8")


def load_data(app, config) -> None:
    """config-inited: read the Persian catalog and the notebooks' run times once per build."""
    source = Path(app.srcdir)
    config.book_fa_messages = read_catalog(source / CATALOG)
    config.book_run_times = run_times.read(source / run_times.CSV)


def reuse_stored_outputs(app) -> None:
    """builder-inited, after myst-nb's: seed its execution cache from the stored outputs.

    Only with execute_notebooks: cache, the book's setting; "off" and "force" ignore the cache.
    """
    from sphinx.util import logging

    config = app.env.mystnb_config
    if config.execution_mode != "cache":
        return
    logger = logging.getLogger(__name__)
    for name, what in book_cache.seed(Path(app.srcdir), Path(config.execution_cache_path)).items():
        logger.info(f"book_cache: {name}: {what}")


def setup(app) -> dict:
    """Register the handlers; priority 900 runs after the themes have filled the context."""
    app.add_config_value("book_fa_messages", {}, "html")
    app.add_config_value("book_run_times", {}, "html")
    app.connect("config-inited", load_data)
    app.connect("builder-inited", reuse_stored_outputs, priority=600)
    app.connect("doctree-read", drop_rtl_wrappers)
    app.connect("html-page-context", page_context, priority=900)
    app.connect("build-finished", mark_rtl)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
