"""The built book: every page exists, Persian pages are marked right-to-left, nothing is remote.

Readers of the Persian edition often have slow or filtered internet, so no page may load a
script, stylesheet, font or image from another host. These tests read the
HTML and CSS that `book_html` (conftest.py) built; tests/book/test_browser.py checks the same
things in a real browser.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from lesson_code.book_build.listings import KEY as LISTING

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]  # the repository root, which is the book root

# <link rel=...> values that name a related page rather than something the browser loads.
NAVIGATION_RELS = {"next", "prev", "index", "search", "canonical", "alternate", "author",
                   "license", "help", "bookmark"}
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")
SHIPPED_FILES = [
    "_static/rtl.css",
    "_static/fonts/vazirmatn/Vazirmatn-Regular.woff2",
    "_static/fonts/vazirmatn/Vazirmatn-Bold.woff2",
    "_static/fonts/vazirmatn/OFL.txt",
    "_static/mathjax/LICENSE",
    "_static/mathjax/es5/tex-chtml.js",
    "_static/mathjax/es5/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff",
    "_static/mathjax/es5/output/chtml/fonts/woff-v2/MathJax_Math-Italic.woff",
    "_static/mathjax/es5/output/chtml/fonts/woff-v2/MathJax_Zero.woff",
]


# Pages of the two editions, relative to the source folder book/: fa/intro, notebooks/en/78-zero.
EDITION_PAGE = re.compile(r"^(?P<folder>notebooks/)?(?P<edition>fa|en)/(?P<name>[^/]+)$")


def edition_of(page: str) -> str | None:
    """"fa" or "en" for a page of one edition, else None (the home page, search)."""
    match = EDITION_PAGE.match(page)
    return match and match["edition"]


def counterpart(page: str) -> str:
    """The same page in the other edition."""
    match = EDITION_PAGE.match(page)
    other = "en" if match["edition"] == "fa" else "fa"
    return f"{match['folder'] or ''}{other}/{match['name']}"


def toc_pages() -> list[str]:
    """Every page named in _toc.yml (root, then each part's chapters and their sections)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    walk(toc.get("chapters", []))
    return pages


class _Assets(HTMLParser):
    """Collects what a page makes the browser fetch, and the attributes of its <body>."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []  # "tag attr=value" for every resource the page loads
        self.css: list[str] = []  # inline <style> blocks and style="" attributes
        self.body: dict[str, str] = {}
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        if "style" in a:
            self.css.append(a["style"])
        if tag == "style":
            self._in_style = True
        if tag == "link" and not set(a.get("rel", "").lower().split()) & NAVIGATION_RELS:
            self.fetched.append(f"link href={a.get('href', '')}")
        for attr in ("src", "srcset", "data", "poster"):
            if attr in a and tag in {"script", "img", "source", "iframe", "embed", "object",
                                     "video", "audio", "track", "input"}:
                self.fetched.append(f"{tag} {attr}={a[attr]}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.css.append(data)


def parse(html_file: Path) -> _Assets:
    parser = _Assets()
    parser.feed(html_file.read_text(encoding="utf-8"))
    return parser


def css_urls(css: str) -> list[str]:
    """The url(...) and @import targets of a stylesheet, without inline data: URIs."""
    found = [a or b for a, b in CSS_URL.findall(css)]
    return [u for u in found if not u.strip().lower().startswith("data:")]


def test_every_toc_page_was_built(book_html: Path) -> None:
    missing = [p for p in toc_pages() if not (book_html / f"{p}.html").is_file()]
    assert not missing, f"pages listed in _toc.yml but not built: {missing}"


def test_no_page_loads_a_remote_asset(book_html: Path) -> None:
    remote = []
    for page in sorted(book_html.rglob("*.html")):
        assets = parse(page)
        name = page.relative_to(book_html)
        for ref in assets.fetched:
            value = ref.split("=", 1)[1]
            if any(REMOTE.match(part) for part in value.split(",")):
                remote.append(f"{name}: <{ref}>")
        for css in assets.css:
            remote += [f"{name}: inline CSS url({u})" for u in css_urls(css) if REMOTE.match(u)]
    for sheet in sorted(book_html.rglob("*.css")):
        name = sheet.relative_to(book_html)
        text = sheet.read_text(encoding="utf-8", errors="replace")
        remote += [f"{name}: url({u})" for u in css_urls(text) if REMOTE.match(u)]
    assert not remote, "assets fetched from other hosts:\n" + "\n".join(remote)


@pytest.mark.parametrize("page", toc_pages())
def test_persian_pages_and_only_they_are_right_to_left(book_html: Path, page: str) -> None:
    assets = parse(book_html / f"{page}.html")
    classes = assets.body.get("class", "").split()
    assert any("rtl.css" in ref for ref in assets.fetched), f"{page} does not load rtl.css"
    if edition_of(page) == "fa":
        assert "lang-fa" in classes and assets.body.get("lang") == "fa", (
            f"{page} is Persian but its <body> is {assets.body}; see book/_templates/layout.html"
        )
    else:
        assert "lang-fa" not in classes and "lang" not in assets.body, (
            f"{page} is not Persian but its <body> is {assets.body}"
        )


def test_fonts_and_mathjax_are_shipped(book_html: Path) -> None:
    missing = [f for f in SHIPPED_FILES if not (book_html / f).is_file()]
    assert not missing, f"files missing from the built book: {missing}"
    # Every font rtl.css names must be in the output, next to it.
    rtl = book_html / "_static" / "rtl.css"
    unresolved = [u for u in css_urls(rtl.read_text(encoding="utf-8"))
                  if not (rtl.parent / u).is_file()]
    assert not unresolved, f"rtl.css points to files that are not in _static: {unresolved}"


def test_mathjax_is_the_shipped_copy(book_html: Path) -> None:
    # Sphinx adds MathJax only to pages with math (and to pages whose toctree contains math).
    loaded = [
        f"{page.relative_to(book_html)}: <{ref}>"
        for page in sorted(book_html.rglob("*.html"))
        for ref in parse(page).fetched
        if "mathjax" in ref.lower()
    ]
    assert loaded, "no page loads MathJax: is mathjax_path set in _config.yml?"
    wrong = [ref for ref in loaded if "_static/mathjax/es5/tex-chtml.js" not in ref]
    assert not wrong, "pages that load another MathJax:\n" + "\n".join(wrong)


# --- The two editions (lesson_code/book_build/pages.py, book/_templates/layout.html) ----------------

HTML_TAG = re.compile(r"<html\b[^>]*>")
ALTERNATE = re.compile(r'<link rel="alternate" hreflang="(fa|en)" href="([^"]+)" />')
SWITCH = re.compile(r'<a class="edition-switch__link" href="([^"]+)" hreflang="(fa|en)"')
# Placeholder of the search box, title of the page's contents, download and full-screen buttons,
# and the sidebar toggles (book/_templates/toggle-*-sidebar.html).
PERSIAN_CHROME = ["جستجو در این کتاب", "فهرست مطالب", 'title="بارگیری فایل', "تمام‌صفحه",
                  "نمایش یا پنهان کردن فهرست کتاب"]


def edition_pages() -> list[str]:
    return [p for p in toc_pages() if edition_of(p)]


@pytest.mark.parametrize("page", edition_pages())
def test_each_page_declares_its_language_and_links_the_other_edition(book_html: Path, page: str):
    html = (book_html / f"{page}.html").read_text(encoding="utf-8")
    persian = edition_of(page) == "fa"
    tag = HTML_TAG.search(html).group(0)
    assert ('lang="fa" dir="rtl"' in tag) if persian else ('lang="en"' in tag and "rtl" not in tag)
    own, other = ("fa", "en") if persian else ("en", "fa")
    target = counterpart(page)
    base = (book_html / page).parent
    alternates = dict(ALTERNATE.findall(html))
    assert set(alternates) == {"fa", "en"}, f"{page}: hreflang alternates {alternates}"
    assert (base / alternates[own]).resolve() == (book_html / f"{page}.html").resolve()
    assert (base / alternates[other]).resolve() == (book_html / f"{target}.html").resolve()
    switch = SWITCH.search(html)
    assert switch and switch.group(2) == other, f"{page} has no visible switch to {other}"
    assert (base / switch.group(1)).resolve() == (book_html / f"{target}.html").resolve()


@pytest.mark.parametrize("page", [p for p in edition_pages() if edition_of(p) == "fa"])
def test_persian_pages_speak_persian_in_the_theme(book_html: Path, page: str):
    html = (book_html / f"{page}.html").read_text(encoding="utf-8")
    has_contents = "onthispage" in html  # pages without sections have no contents list
    missing = [s for s in PERSIAN_CHROME if s not in html and (has_contents or s != "فهرست مطالب")]
    assert not missing, f"{page} lacks the Persian theme strings {missing}"
    english = ["Search this book", ">Contents<", 'title="Download', 'title="Toggle', 'title="Fullscreen']
    assert not [s for s in english if s in html], f"{page} shows the theme's English strings"


@pytest.mark.parametrize("page", [p for p in edition_pages() if p.startswith("notebooks/")])
def test_each_lesson_shows_its_listings_as_highlighted_code_and_no_test_markers(book_html: Path,
                                                                                 page: str):
    """Every listing cell of the notebook is a Python block of the page, its `def` or `class`
    line highlighted by Pygments (a method's name among them), in the notebook's order; no code
    cell shows the comments that once told nbval what to compare."""
    html = (book_html / f"{page}.html").read_text(encoding="utf-8")
    cells = json.loads((ROOT / f"{page}.ipynb").read_text(encoding="utf-8"))["cells"]
    names = [cell["metadata"][LISTING].rsplit("::", 1)[1].rsplit(".", 1)[-1] for cell in cells
             if cell["cell_type"] == "markdown" and LISTING in cell.get("metadata", {})]
    assert names, f"{page} shows no listing"
    blocks = re.findall(r'<div class="highlight-python notranslate">(.*?)</pre>', html, re.DOTALL)
    defined = [match.group(1) for block in blocks for match in re.finditer(
        r'<span class="k">(?:def|class)</span>(?:\s|<span class="w">\s*</span>)*'
        r'<span class="(?:nf|nc|fm)">(\w+)</span>', block)]
    found = iter(defined)
    missing = [name for name in names if name not in found]  # in order: `in` advances the iterator
    assert not missing, f"{page}: no highlighted definition of {missing} (in order) among {defined}"
    assert "NBVAL" not in html, f"{page} shows nbval's markers"


@pytest.mark.parametrize("page", [p for p in edition_pages() if p.startswith("notebooks/")])
def test_each_lesson_says_how_to_run_it_and_offers_its_notebook(book_html: Path, page: str):
    html = (book_html / f"{page}.html").read_text(encoding="utf-8")
    folder, name = page.rsplit("/", 1)
    assert "make lab" in html and f"<code>{folder}/{name}.ipynb</code>" in html
    box = re.search(r'<aside class="run-lesson.*?</aside>', html, flags=re.DOTALL).group(0)
    commands = re.findall(r'<pre class="run-lesson__command" dir="ltr"><code>(.*?)</code></pre>', box)
    edition = folder.rsplit("/", 1)[1]
    assert commands == ["make lab", ".venv/bin/jupyter nbconvert --to notebook --execute "
                        f"--output-dir _build/executed/{edition} {folder}/{name}.ipynb"]
    # ... and says where that command leaves the executed lesson
    assert f"<code>_build/executed/{edition}/{name}.ipynb</code>" in box
    # ... and, in Persian, says on what machine it ran in Persian words (no English "CPUs")
    if edition == "fa" and "run-lesson__seconds" in box:
        assert "CPUs" not in box and " پردازنده، " in box, box
    sentences = re.findall(r"<p>(.*?)</p>", box, flags=re.DOTALL)
    inline = [code for p in sentences for code in re.findall(r"<code>(.*?)</code>", p) if " " in code]
    assert not inline, f"{page}: commands inside a sentence, where bidi can reorder them: {inline}"
    download = re.search(r'class="run-lesson__download" href="([^"]+)"', html)
    assert download, f"{page} has no download link for its notebook"
    notebook = ((book_html / page).parent / download.group(1)).resolve()
    assert notebook.is_file() and notebook.suffix == ".ipynb"
    assert notebook.read_bytes() == (ROOT / f"{page}.ipynb").read_bytes()
