"""The built lesson pages in headless Chromium, with every request to another host blocked.

What only a browser can tell: the Persian article is laid out right-to-left while code stays
left-to-right, its Persian text is drawn with the shipped Vazirmatn (asked of Chromium itself
through the DevTools protocol, CSS.getPlatformFontsForNode), and MathJax renders from the local
copy. A screenshot of each Persian lesson is saved in _build/screenshots/ for a human to look at.

Skipped when Chromium or Playwright is missing on a developer machine; fails instead when the
environment variable CI is set.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium-headless-shell")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
SCREENSHOTS = ROOT / "_build" / "screenshots"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
LESSONS = sorted(path.stem for path in (ROOT / "notebooks" / "fa").glob("*.ipynb"))
ENGLISH_LESSON = "notebooks/en/76-collectives.html"
MATHJAX_TIMEOUT_MS = 30_000


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the browser checks must run")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing (Debian: apt-get install chromium-headless-shell)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable('playwright is not installed (pip install -e ".[test]")')
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def site(book_html: Path) -> Iterator[str]:
    """Serve the built book on a free localhost port; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(book_html))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        pass


@dataclass
class Visit:
    """One page load: the page, and every request it tried that was blocked or failed."""

    page: object
    blocked: list[str] = field(default_factory=list)  # requests to other hosts (aborted)
    failed: list[str] = field(default_factory=list)  # local requests that did not succeed
    fetched: list[str] = field(default_factory=list)  # local URLs served successfully
    console: list[str] = field(default_factory=list)  # console errors and warnings, page errors


def listen_to_console(page, result: Visit) -> None:
    """Record in `result.console` every console error or warning and every uncaught error."""
    page.on("console", lambda message: result.console.append(f"{message.type}: {message.text}")
            if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: result.console.append(f"uncaught: {error}"))


def watch(page) -> Visit:
    """`page` kept offline (requests to hosts other than localhost recorded and aborted) and its
    console recorded: the Visit that collects both."""
    result = Visit(page)

    def route(r) -> None:
        if urlparse(r.request.url).hostname in LOCAL_HOSTS:
            r.continue_()
        else:
            result.blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    listen_to_console(page, result)
    return result


def visit(browser, url: str) -> Visit:
    """Open `url` offline: requests to hosts other than localhost are recorded and aborted."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    result = watch(page)

    def on_response(response) -> None:
        if urlparse(response.url).hostname not in LOCAL_HOSTS:
            return
        if response.status >= 400:
            result.failed.append(f"{response.status} {response.url}")
        else:
            result.fetched.append(response.url)

    page.on("response", on_response)
    # "load" waits for every file the page names; what comes later is MathJax's work: it
    # typesets after load (its startup promise resolves when the page is done), then its fonts.
    page.goto(url, wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                           timeout=MATHJAX_TIMEOUT_MS)
    page.evaluate("() => MathJax.startup.promise")
    page.evaluate("() => document.fonts.ready.then(() => true)")
    return result


def computed(page, selector: str, prop: str) -> str:
    """The computed CSS `prop` of the first element matching `selector` (raises if none)."""
    return page.eval_on_selector(selector, f"el => getComputedStyle(el).{prop}")


def fonts_rendering(page, selector: str) -> list[dict]:
    """Chromium's own answer: which platform fonts drew the text directly inside `selector`."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    assert node, f"no element matches {selector!r}"
    return cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]


def assert_offline_and_complete(v: Visit) -> None:
    """No request left localhost, every local file was there, and the console stayed empty."""
    if v.blocked:
        pytest.fail("the page tried to reach other hosts:\n" + "\n".join(v.blocked))
    if v.failed:
        pytest.fail("local files the page needs are missing:\n" + "\n".join(v.failed))
    if v.console:
        pytest.fail("the browser console reported:\n" + "\n".join(v.console))


def assert_mathjax_rendered(v: Visit) -> None:
    assert v.page.locator("mjx-container").count() > 0, "MathJax rendered no formula"
    assert v.page.locator("mjx-merror").count() == 0, "MathJax reported a TeX error"
    assert any("/_static/mathjax/es5/output/chtml/fonts/woff-v2/" in u for u in v.fetched), (
        "MathJax did not load its fonts from _static/mathjax"
    )


@pytest.mark.parametrize("lesson", LESSONS)
def test_persian_lesson_is_rtl_in_vazirmatn_and_offline(browser, site: str, lesson: str) -> None:
    v = visit(browser, f"{site}/notebooks/fa/{lesson}.html")
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        # The whole page, for a human to look at: JPEG, which Chromium encodes twice as fast.
        v.page.screenshot(path=str(SCREENSHOTS / f"fa-{lesson}.jpg"), full_page=True, type="jpeg",
                          quality=80)
        assert_offline_and_complete(v)

        assert computed(v.page, "article.bd-article", "direction") == "rtl"
        assert computed(v.page, ".cell_input pre", "direction") == "ltr"
        if v.page.locator("div.math").count():
            assert computed(v.page, "div.math", "direction") == "ltr"

        # Mark the first paragraph that is mostly Persian, then ask Chromium what drew it.
        found = v.page.evaluate("""() => {
            const isPersian = p => (p.textContent.match(/[\\u0600-\\u06FF]/g) || []).length > 10;
            const p = [...document.querySelectorAll("article.bd-article p")].find(isPersian);
            if (p) p.setAttribute("data-test-persian", "");
            return Boolean(p);
        }""")
        assert found, "the Persian lesson has no Persian paragraph"
        fonts = fonts_rendering(v.page, "[data-test-persian]")
        main = max(fonts, key=lambda f: f["glyphCount"])
        assert "Vazirmatn" in main["familyName"] and main["isCustomFont"], (
            f"Persian text is drawn with {fonts}, expected the shipped web font Vazirmatn"
        )
        assert_mathjax_rendered(v)
        assert not numbers_broken_across_lines(v.page)  # at a desktop's width too
    finally:
        v.page.context.close()


def test_english_lesson_is_ltr_and_offline(browser, site: str) -> None:
    v = visit(browser, f"{site}/{ENGLISH_LESSON}")
    try:
        assert_offline_and_complete(v)
        assert computed(v.page, "article.bd-article", "direction") == "ltr"
        assert_mathjax_rendered(v)
    finally:
        v.page.context.close()


# --- The two editions: language, chrome, navigation, switch, calculator, search --------------

def toc_pages() -> list[str]:
    """The root page and every chapter of _toc.yml's parts, each followed by its sections (the
    optional pages after a lesson, such as 78a)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [toc["root"]] + [page for part in toc["parts"] for chapter in part["chapters"]
                            for page in [chapter["file"]] + [s["file"] for s in chapter.get("sections", [])]]


EDITION_PAGES = ["fa/intro", "en/intro", "notebooks/fa/78-zero", "notebooks/en/78-zero",
                 "fa/glossary", "en/glossary"]


def open_page(browser, url: str) -> Visit:
    """Open `url` offline like visit(), without waiting for MathJax (pages without formulas)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    result = watch(page)
    page.on("response", lambda r: result.failed.append(f"{r.status} {r.url}")
            if r.status >= 400 and urlparse(r.url).hostname in LOCAL_HOSTS else None)
    page.goto(url, wait_until="load")
    page.evaluate("() => document.fonts.ready.then(() => true)")
    return result


def shoot(v: Visit, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


@pytest.mark.parametrize("page", toc_pages() + ["search"])
def test_no_page_reaches_another_host_or_logs_an_error(browser, site: str, page: str) -> None:
    v = open_page(browser, f"{site}/{page}.html")
    try:
        assert_offline_and_complete(v)
    finally:
        v.page.context.close()


@pytest.mark.parametrize("page", EDITION_PAGES)
def test_edition_language_direction_and_chrome(browser, site: str, page: str) -> None:
    v = open_page(browser, f"{site}/{page}.html")
    try:
        shoot(v, "edition-" + page.replace("/", "-"))
        persian = page.startswith("fa/") or "/fa/" in page
        html = v.page.evaluate("() => [document.documentElement.lang, document.documentElement.dir]")
        assert html == (["fa", "rtl"] if persian else ["en", ""]), f"<html> of {page}: {html}"
        placeholder = v.page.get_attribute("form.bd-search input[name=q]", "placeholder")
        contents = v.page.locator(".bd-sidebar-secondary .onthispage")
        toc_title = contents.first.inner_text() if contents.count() else None  # none on glossaries
        if persian:
            assert placeholder == "جستجو در این کتاب…"
            assert toc_title in (None, "فهرست مطالب") or "فهرست مطالب" in toc_title
            assert computed(v.page, ".prev-next-area", "direction") == "rtl"
            if toc_title:
                assert computed(v.page, ".bd-sidebar-secondary", "direction") == "rtl"
        else:
            assert placeholder.startswith("Search")
            assert toc_title is None or "Contents" in toc_title
        # Every Persian entry of the site navigation reads right-to-left, English ones left-to-right.
        entries = v.page.evaluate("""() => [...document.querySelectorAll(".bd-sidebar-primary nav li")]
            .map(li => [li.querySelector("a").pathname, getComputedStyle(li).direction])""")
        persian_entries = [d for path, d in entries if re.search("^/(notebooks/)?fa/", path)]
        english_entries = [d for path, d in entries if re.search("^/(notebooks/)?en/", path)]
        assert persian_entries and set(persian_entries) == {"rtl"}, entries
        assert english_entries and set(english_entries) == {"ltr"}, entries
    finally:
        v.page.context.close()


@pytest.mark.parametrize("page", ["notebooks/fa/78-zero", "en/glossary", "fa/references"])
def test_the_switch_lands_on_the_same_page_in_the_other_edition(browser, site: str, page: str):
    v = open_page(browser, f"{site}/{page}.html")
    try:
        link = v.page.locator("nav.edition-switch a[hreflang]")
        folder, edition, name = re.fullmatch(r"((?:notebooks/)?)(fa|en)/(.+)", page).groups()
        other = "en" if edition == "fa" else "fa"
        assert link.get_attribute("hreflang") == other and link.is_visible()
        with v.page.expect_navigation(wait_until="load"):
            link.click()
        assert v.page.url.endswith(f"/{folder}{other}/{name}.html"), v.page.url
        assert v.page.evaluate("document.documentElement.lang") == other
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition, figures", [("en", ["5.5Ψ", "4.19Ψ"]), ("fa", ["۵٫۵Ψ", "۴٫۱۹Ψ"])])
def test_the_memory_calculator_works_offline(browser, site: str, edition: str, figures: list):
    v = open_page(browser, f"{site}/notebooks/{edition}/78-zero.html")
    try:
        assert_offline_and_complete(v)
        calculator = v.page.locator("div.memory-calculator")
        assert calculator.count() == 1 and calculator.get_attribute("lang") == edition
        zero1 = calculator.locator("tr[data-stage='ZeRO-1'] td.per-param")
        for world_size, figure in zip(["8", "64"], figures, strict=True):
            calculator.locator("input[name=world_size]").fill(world_size)
            assert zero1.inner_text() == figure
        check_scale_lab_points(calculator, edition)
        calculator.scroll_into_view_if_needed()
        shoot(v, f"calculator-{edition}")
    finally:
        v.page.context.close()


def check_scale_lab_points(calculator, edition: str) -> None:
    """Under the calculator, for the strategy chosen: the model state per rank that the stored
    sweep of lesson 78b's scale lab holds for each N, in MB, its model's parameter count, and
    the sweep's date and machine."""
    from lesson_code import scale_lab
    from lesson_code.plots import number
    from lesson_code.scale_lab import stored as scale_stored

    table, note = scale_stored.load()
    section = calculator.locator("div.memory-calculator__scale-lab")
    assert section.count() == 1
    for strategy in ("ZeRO-3", "DDP"):
        section.locator("select[name=strategy]").select_option(strategy)
        rows = table[table["strategy"] == strategy].sort_values("N")
        assert section.locator("tr[data-n]").evaluate_all(
            "rows => rows.map(r => [Number(r.dataset.n), Number(r.dataset.bytes)])") == \
            [[int(n), int(b)] for n, b in zip(rows["N"], rows["model_states"])]
        assert section.locator("td.measured").all_inner_texts() == \
            [shown(b / 1e6, edition, 2) for b in rows["model_states"]]
    text = section.inner_text()
    from lesson_code.bench.stored import persian_machine

    machine = note["machine"] if edition == "en" else persian_machine(note["machine"])
    assert number(note["measured"], edition) in text and machine in text, text
    parameters = f"{scale_lab.measured_points(table)['model']['parameters']:,}"
    assert number(parameters.replace(",", "٬" if edition == "fa" else ","), edition) in text, text
    if edition == "fa":  # every Latin run of its Persian text in a left-to-right isolate
        from test_explorer_text import LOOSE_LATIN

        assert not calculator.page.evaluate(LOOSE_LATIN, "div.memory-calculator__scale-lab")


@pytest.mark.parametrize("edition", ["fa", "en"])
def test_the_implementation_section_shows_its_code_left_to_right(browser, site: str, edition: str):
    """Lesson 78's listings, in both editions: highlighted Python read left to right (in the
    Persian article too), where the prose introduces them. A screenshot of the section."""
    v = open_page(browser, f"{site}/notebooks/{edition}/78-zero.html")
    try:
        step = v.page.locator("div.highlight-python pre", has_text="def step(self)").first
        step.wait_for()
        assert step.evaluate("e => getComputedStyle(e).direction") == "ltr"
        assert step.locator("span.k", has_text="def").count() and step.locator("span.nf").count()
        step.evaluate("e => e.setAttribute('data-test-listing', '')")
        xy = v.page.evaluate(WORD_XY, ["[data-test-listing]", {"def": {"text": "def"},
                                                                "step": {"text": "step"}}])
        assert reading_order(xy, "ltr") == ["def", "step"], xy
        heading = v.page.locator("article h2", has_text="پیاده‌سازی" if edition == "fa"
                                 else "The implementation").first
        heading.evaluate("e => e.scrollIntoView({block: 'start'})")
        shoot(v, f"book-{edition}-78-implementation")
        assert_offline_and_complete(v)
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition, word", [("fa", "حافظه"), ("en", "memory")])
def test_search_finds_the_word_in_the_edition_it_was_asked_from(browser, site, edition, word):
    v = open_page(browser, f"{site}/notebooks/{edition}/78-zero.html")
    try:
        v.page.evaluate("""(word) => { const form = document.querySelector("form.bd-search");
            form.querySelector("input[name=q]").value = word; form.submit(); }""", word)
        v.page.wait_for_url("**/search.html?**")
        v.page.wait_for_function("""() => { const s = document.querySelector("#search-results p");
            return s && s.textContent && !/^(Searching|در حال جستجو)/.test(s.textContent)
                   && document.querySelectorAll("#search-results ul.search li").length > 0; }""",
                                 timeout=30_000)
        v.page.wait_for_timeout(300)  # results are appended one by one
        hits = v.page.eval_on_selector_all("#search-results ul.search li > a",
                                           "links => links.map(a => a.pathname)")
        shoot(v, f"search-{edition}")
        other = "en" if edition == "fa" else "fa"
        assert any(f"/{edition}/" in h for h in hits), hits
        assert not [h for h in hits if f"/{other}/" in h], f"{other} pages in the {edition} search"
        if edition == "fa":
            summary = v.page.inner_text("#search-results p.search-summary")
            assert "جستجو تمام شد" in summary and not re.search("[0-9]", summary), summary
            assert v.page.evaluate("document.documentElement.dir") == "rtl"
    finally:
        v.page.context.close()


# Where the browser draws each word of an element's text: the middle of the word's first
# character, [x, y], for each of `words` ({key: {"text": ..., "from": offset}}).
WORD_XY = """([selector, words]) => {
    const element = document.querySelector(selector);
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    const found = {};
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const [key, word] of Object.entries(words)) {
            const at = node.data.indexOf(word.text, word.from || 0);
            if (key in found || at < 0) continue;
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + 1);
            const box = range.getBoundingClientRect();
            found[key] = [box.left + box.width / 2, box.top + box.height / 2];
        }
    }
    return found;
}"""
LINE_TOLERANCE_PX = 8  # two characters whose middles are this close in height share a line


def reading_order(positions: dict[str, list[float]], direction: str) -> list[str]:
    """The keys of `positions` in the order a reader meets them: line by line from the top, and
    on each line from the left ("ltr") or from the right ("rtl")."""
    lines: list[float] = []
    for _, y in sorted(positions.values(), key=lambda xy: xy[1]):
        if not lines or y - lines[-1] > LINE_TOLERANCE_PX:
            lines.append(y)
    line_of = lambda y: min(range(len(lines)), key=lambda i: abs(lines[i] - y))
    sign = 1 if direction == "ltr" else -1
    return sorted(positions, key=lambda k: (line_of(positions[k][1]), sign * positions[k][0]))


TITLE_WORDS = {"amoozesh": {"text": "آموزش"}, "dar": {"text": "در "},
               "pytorch_fa": {"text": "PyTorch"}, "dot": {"text": "·"},
               "distributed": {"text": "Distributed"}, "training": {"text": "Training"}}


@pytest.mark.parametrize("page, selector", [("index", "article h1"), ("fa/intro", ".logo__title"),
                                            ("en/intro", ".logo__title")])
def test_the_bilingual_title_reads_in_order_in_both_directions(browser, site, page, selector):
    v = open_page(browser, f"{site}/{page}.html")
    try:
        xy = v.page.evaluate(WORD_XY, [selector, TITLE_WORDS])
        assert set(xy) == set(TITLE_WORDS), xy
        persian = {k: xy[k] for k in ("amoozesh", "dar", "pytorch_fa")}
        english = {k: xy[k] for k in ("distributed", "training")}
        assert reading_order(persian, "rtl") == ["amoozesh", "dar", "pytorch_fa"], xy
        assert reading_order(english, "ltr") == ["distributed", "training"], xy
        # Then the dot, then the English title, in the page's own direction.
        page_direction = "rtl" if page.startswith("fa/") else "ltr"
        for word in persian:
            assert reading_order({word: xy[word], "dot": xy["dot"]}, page_direction)[0] == word, xy
        for word in english:
            assert reading_order({word: xy[word], "dot": xy["dot"]}, page_direction)[0] == "dot", xy
    finally:
        v.page.context.close()


# --- Phones: every page of both editions fits the screen --------------------------------------

PHONE_WIDTHS = (390, 360)  # a common phone, and a small one
PHONE_HEIGHT = 844


def fits_the_screen(page) -> dict:
    """The document's width against the screen's, the horizontal scroll, and for a heading the
    edges of its box (a right-to-left page must open at its right edge, its title whole)."""
    return page.evaluate("""() => { const h1 = document.querySelector("article h1");
        const box = h1 ? h1.getBoundingClientRect() : null;
        return {document: document.documentElement.scrollWidth,
                screen: document.documentElement.clientWidth, scrolled: window.scrollX,
                title: box && [box.left, box.right]}; }""")


def numbers_broken_across_lines(page) -> list[str]:
    """The numbers with a power of ten in the page's output tables («۹٫۹۴۹۹۸۷ × ۱۰⁻⁸», a
    left-to-right isolate holding a <sup>) that are drawn on more than one line."""
    return page.evaluate("""() => [...document.querySelectorAll(".cell_output table bdi")]
        .filter(b => b.querySelector("sup") && b.getClientRects().length > 1)
        .map(b => b.textContent)""")


@pytest.mark.parametrize("page", toc_pages() + ["search"])
def test_every_page_fits_a_phone_screen_in_both_widths(browser, site: str, page: str) -> None:
    context = browser.new_context(viewport={"width": PHONE_WIDTHS[0], "height": PHONE_HEIGHT},
                                  is_mobile=True, has_touch=True, device_scale_factor=2)
    v = watch(context.new_page())
    try:
        v.page.goto(f"{site}/{page}.html", wait_until="load")
        v.page.evaluate("() => document.fonts.ready.then(() => true)")
        lesson = re.fullmatch(r"notebooks/(fa|en)/(.+)", page)
        for width in PHONE_WIDTHS:
            v.page.set_viewport_size({"width": width, "height": PHONE_HEIGHT})
            seen = fits_the_screen(v.page)
            assert seen["document"] <= seen["screen"] == width, (page, width, seen)
            assert seen["scrolled"] == 0, (page, width, seen)
            if seen["title"]:
                left, right = seen["title"]
                assert 0 <= left and right <= width, (page, width, seen)  # the title whole
            assert not numbers_broken_across_lines(v.page), (page, width)  # «× ۱۰⁻⁸» alone
            if lesson and width == PHONE_WIDTHS[0]:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                v.page.screenshot(path=str(SCREENSHOTS / f"phone-{lesson[1]}-{lesson[2]}.png"))
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        context.close()


# --- The explorers: each lesson's figure that the reader moves, offline, in both editions -----

def shown(value: float, lang: str, places: int) -> str:
    """A number as the explorers print it: rounded to `places`, trailing zeros dropped, in the
    edition's digits (explorer-common.js's format)."""
    from lesson_code.plots import number

    return number(f"{value:.{places}f}".rstrip("0").rstrip("."), lang)


def open_at(browser, url: str, size: dict) -> Visit:
    """`url` offline in a fresh context of `size` (a phone: touch, mobile), fonts loaded."""
    phone = size["width"] < 992
    context = browser.new_context(viewport=size, is_mobile=phone, has_touch=phone)
    v = watch(context.new_page())
    v.page.goto(url, wait_until="load")
    v.page.evaluate("() => document.fonts.ready.then(() => true)")
    return v


def check_explorer_76(explorer, edition: str) -> None:
    """N = 8 and a 64 MiB message: the bytes each rank sends, and auto's choice, as the package
    computes them; a step moved with the keyboard outlines one chunk per rank."""
    from lesson_code.book_build import explorer_data
    from lesson_code.collectives import choose, cost_model

    explorer.locator("input[name=world_size]").fill("8")
    explorer.locator("select[name=nbytes]").select_option(str(2 ** 26))
    sent = cost_model.bytes_per_rank("all_reduce", 2 ** 26, 8) / 2 ** 20
    assert explorer.locator("dd[data-value=bytes]").inner_text() == f"{shown(sent, edition, 3)} MiB"
    auto = choose.stored_costs(choose.STORED).decisions(8).choose(2 ** 26)
    assert explorer.locator("tr[data-auto=true]").get_attribute("data-algorithm") == auto
    models = explorer_data.collectives()["models"]
    assert set(models) == set(
        explorer.locator("tr[data-algorithm]").evaluate_all("rows => rows.map(r => r.dataset.algorithm)"))
    # times modelled with the cluster's one alpha and beta for every algorithm
    ring_ms = 1e3 * cost_model.predict(models["ring"], 2 ** 26, 8, cost_model.CLUSTER.alpha,
                                       cost_model.CLUSTER.beta)
    assert explorer.locator("tr[data-algorithm=ring] td").nth(3).inner_text() == shown(ring_ms, edition, 3)
    step = explorer.locator("input[name=step]")
    step.focus()
    step.press("ArrowUp")
    assert explorer.locator("rect.explorer__sent").count() == 8


def check_explorer_79(explorer, edition: str) -> None:
    """GPipe, P = 4, m from 8 to 9 with the keyboard: the bubble formula and the chart's idle
    share as lesson_code.pipeline computes them, every stage holding all 9 micro-batches."""
    from lesson_code import pipeline

    explorer.locator("select[name=schedule]").select_option("gpipe")
    explorer.locator("input[name=stages]").fill("4")
    micro = explorer.locator("input[name=micro_batches]")
    micro.fill("8")
    micro.focus()
    micro.press("ArrowUp")
    events = pipeline.ideal_timeline("gpipe", 4, 9)
    assert explorer.locator("dd[data-value=formula]").inner_text() == shown(
        pipeline.theoretical_bubble(4, 9), edition, 3)
    assert explorer.locator("dd[data-value=idle]").inner_text() == shown(
        pipeline.bubble_fraction(events, 4), edition, 3)
    assert explorer.locator("rect.explorer__box").count() == len(events) == 2 * 4 * 9
    assert explorer.locator("dd[data-value=peaks]").inner_text().count(shown(9, edition, 0)) == 4


def check_explorer_80(explorer, edition: str) -> None:
    """Four ranks, a crash after each event in turn (the keyboard moving it): until the rename
    publishes step 2, latest_checkpoint loads step 1, except once the hidden copy is complete. The
    events are numbered in the page's digits."""
    explorer.locator("input[name=world_size]").fill("4")
    crash = explorer.locator("input[name=crash_after]")
    crash.fill("0")
    crash.focus()
    loaded = [explorer.locator("dd[data-value=latest]").inner_text()]
    for _ in range(4 + 7):  # the save of 4 ranks changes the folder 11 times
        crash.press("ArrowUp")
        loaded.append(explorer.locator("dd[data-value=latest]").inner_text())
    assert loaded == ["step-00000001"] * 10 + ["step-00000002"] * 2, loaded
    assert explorer.locator("li[data-state=pending]").count() == 0
    crash.fill("6")
    assert ".step-00000002.tmp/shard-00003-of-00004.pt" in explorer.locator("pre").inner_text()
    assert explorer.locator("li[data-state=pending]").count() == 5
    numbering = explorer.locator("ol").evaluate("(ol) => getComputedStyle(ol).listStyleType")
    assert numbering == ("persian" if edition == "fa" else "decimal"), numbering


def check_explorer_81(explorer, edition: str) -> None:
    """A 12-block, 768-wide MiniGPT on 8 ranks: its parameters and the capstone's bytes per rank
    as lesson_code counts them; the stored curve drawn with its rollback."""
    from lesson_code import memory
    from lesson_code.models import GPTConfig, gpt_parameters

    explorer.locator("input[name=world_size]").fill("8")
    explorer.locator("input[name=n_layer]").fill("12")
    explorer.locator("select[name=n_embd]").select_option("768")
    params = gpt_parameters(GPTConfig(n_layer=12, n_embd=768))
    from lesson_code.plots import number

    grouped = number(f"{params:,}", edition)
    assert explorer.locator("dd[data-value=params]").inner_text() == (
        grouped.replace(",", "٬") if edition == "fa" else grouped)
    expected = shown(sum(memory.capstone_bytes(params, 8).values()) / 1e6, edition, 0)
    assert explorer.locator("dd[data-value=zero]").inner_text() == f"{expected} MB"
    assert explorer.locator("line.explorer__rollback").count() == 2  # the rollback, the rejected step
    outside = explorer.locator("svg.explorer__chart").evaluate_all("""charts => charts.flatMap(svg =>
        [...svg.querySelectorAll("text")].filter(text => { const box = text.getBBox();
            return box.x < 0 || box.x + box.width > svg.viewBox.baseVal.width; }).map(text => text.textContent))""")
    assert outside == [], f"labels drawn outside their chart: {outside}"


def check_explorer_77(explorer, edition: str) -> None:
    """Quarter-megabyte buckets: the model's buckets and exposed communication as ddp_lab's
    overlap_model gives them, beside the stored benchmark's measured wait; at 8 MB, none stored."""
    from lesson_code import ddp_lab
    from lesson_code.book_build import explorer_data

    data = explorer_data.ddp()
    explorer.locator("select[name=bucket_mb]").select_option("0.25")
    model = ddp_lab.overlap_model(data["sizes"], 0.25, data["backward_s"], data["alpha"],
                                  data["beta"], data["world_size"], data["work"])
    assert explorer.locator("dd[data-value=buckets]").inner_text() == shown(len(model["buckets"]), edition, 0)
    assert explorer.locator("dd[data-value=ratio]").inner_text() == \
        shown(ddp_lab.communication_ratio(data), edition, 2)
    assert explorer.locator("dd[data-value=exposed]").inner_text() == \
        f"{shown(model['exposed_s'] * 1e3, edition, 1)} ms"
    assert explorer.locator("dd[data-value=measured]").inner_text() == \
        f"{shown(data['measured_wait_ms']['0.25'], edition, 1)} ms"
    assert explorer.locator("rect.explorer__box").count() == 2 * len(model["buckets"])
    explorer.locator("select[name=bucket_mb]").select_option("8")
    assert "ms" not in explorer.locator("dd[data-value=measured]").inner_text()


def check_explorer_78a(explorer, edition: str) -> None:
    """Lesson 78a: one ZeRO-3 step on 8 ranks, event by event, is memory.stage3_step's; the peak
    measured on 4 ranks is the stored table's."""
    from lesson_code import memory, zero_lab
    from lesson_code.book_build import explorer_data

    events = memory.stage3_step(zero_lab.stage3_units(), 8)
    explorer.locator("input[name=world_size]").fill("8")
    assert explorer.locator("dd[data-value=held]").inner_text() == \
        f"{shown(events[0]['held'] / 1e6, edition, 2)} MB"
    assert explorer.locator("svg rect[data-action]").count() == len(events)
    peak = max(event["held"] for event in events)
    assert explorer.locator("dd[data-value=peak]").inner_text().startswith(f"{shown(peak / 1e6, edition, 2)} MB")
    for _ in range(4):  # the start, then the embedding's gather, compute, free; then block 0's gather
        explorer.locator("button", has_text="▶").click()
    assert f"{shown(events[4]['held'] / 1e6, edition, 2)} " in explorer.locator("dd[data-value=event]").inner_text()
    explorer.locator("input[name=world_size]").fill("4")
    stored = explorer_data.zero_stages()["measured_peaks"]["4"]["peak"]
    assert explorer.locator("dd[data-value=measured]").inner_text() == f"{shown(stored / 1e6, edition, 2)} MB"


EXPLORER_CHECKS = {"76-collectives": check_explorer_76, "77-ddp": check_explorer_77,
                   "78a-zero-stages": check_explorer_78a, "79-pipeline": check_explorer_79,
                   "80-checkpoint": check_explorer_80, "81-capstone": check_explorer_81}


@pytest.mark.parametrize("phone", [False, True], ids=["desktop", "phone"])
@pytest.mark.parametrize("edition", ["en", "fa"])
@pytest.mark.parametrize("lesson", sorted(EXPLORER_CHECKS))
def test_each_explorer_computes_what_the_package_does(browser, site, lesson, edition, phone):
    size = {"width": PHONE_WIDTHS[0], "height": PHONE_HEIGHT} if phone else {"width": 1280, "height": 900}
    v = open_at(browser, f"{site}/notebooks/{edition}/{lesson}.html", size)
    try:
        name = lesson.split("-")[0]  # "78a-zero-stages": 78a
        explorer = v.page.locator(f"div.explorer[data-explorer='{name}']")
        assert explorer.count() == 1 and explorer.get_attribute("lang") == edition
        EXPLORER_CHECKS[lesson](explorer, edition)
        explorer.scroll_into_view_if_needed()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        explorer.screenshot(path=str(SCREENSHOTS / f"explorer-{name}-{edition}-"
                                                   f"{'phone' if phone else 'desktop'}.png"))
        assert v.page.evaluate("document.documentElement.scrollWidth") <= v.page.viewport_size["width"]
        if not phone:  # the theme's dark mode: the explorer's words take the page's text colour
            v.page.emulate_media(color_scheme="dark")
            v.page.wait_for_function("document.documentElement.dataset.theme === 'dark'")
            colours = v.page.evaluate("""(host) => [getComputedStyle(document.querySelector(host + ' .explorer__title')).color,
                getComputedStyle(document.querySelector('article.bd-article p')).color,
                [...document.querySelectorAll(host + ' .explorer__label')].map(t => getComputedStyle(t).fill)]""",
                f"div.explorer[data-explorer='{name}']")
            title, text, labels = colours
            assert title == text and all(fill == text for fill in labels), colours
            explorer.screenshot(path=str(SCREENSHOTS / f"explorer-{name}-{edition}-dark.png"))
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        v.page.context.close()
