"""Reading the built book in headless Chromium, both editions, offline: what a reader touches.

- the sidebar buttons: on a phone ☰ opens the site navigation and the contents button the page's
  contents; below 992 px the navigation opens on the ☰ button's side (the right on a Persian
  page); on a desktop ☰ hides and shows the primary sidebar (pydata-sphinx-theme #2451: the
  themes listen only to a hidden copy of each button; book/static/editions.js passes clicks on);
- Latin inside Persian: lists joined by the Persian comma keep their order, hyphenated words are
  never broken at the hyphen (editions.js isolates each Latin run);
- search: Arabic yeh and kaf find the Persian words, previews start at the page's own text,
  Latin runs in Persian results are isolated;
- right-to-left geometry: the language switch and the run box inside the text column, the text
  column beside the sidebar, previous/next and the contents bar mirrored, no slanted Persian;
- what a Persian lesson's cells print: each line in its own direction, a Persian line starting
  at the right edge with its words and numbers in reading order, a Latin one at the left.

Positions are asked of the browser (WORD_XY, reading_order from test_browser.py). Screenshots go
to _build/screenshots/ for a human to look at.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from test_browser import (  # noqa: F401 (fixtures)
    SCREENSHOTS, TITLE_WORDS, WORD_XY, Visit, browser, open_at, reading_order, site,
)

pytestmark = pytest.mark.book

EDITIONS = ["fa", "en"]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 975, "height": 700}  # between the themes' breakpoints, 960 and 992


def shoot(v: Visit, name: str, **options) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), **options)


def box(page, selector: str) -> dict:
    return page.eval_on_selector(selector, "e => e.getBoundingClientRect().toJSON()")


def visible_button(page, kind: str):
    """The copy of the ☰ ("primary") or contents ("secondary") button a reader can see."""
    buttons = page.locator(f"button.{kind}-toggle").filter(visible=True)
    assert buttons.count() == 1, f"{buttons.count()} visible {kind} buttons"
    return buttons.first


# --- 1. The sidebar buttons ---------------------------------------------------------------------

def wait_at_the_menu_button_edge(page, edition: str) -> None:
    """Wait until the open site navigation touches the window's edge on the side of the ☰
    button: the right on a Persian page, the left on an English one."""
    edge = "Math.round(r.right) === innerWidth" if edition == "fa" else "Math.round(r.left) === 0"
    page.wait_for_function(f"""() => {{ const r = document.getElementById(
        "pst-primary-sidebar-modal").getBoundingClientRect(); return {edge}; }}""", timeout=5000)


@pytest.mark.parametrize("edition", EDITIONS)
def test_on_a_phone_the_menu_opens_the_navigation_and_contents_the_page_contents(
        browser, site, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/81-capstone.html", PHONE)
    try:
        visible_button(v.page, "primary").click()
        v.page.wait_for_selector("#pst-primary-sidebar-modal[open]", timeout=5000)
        v.page.wait_for_function("""(path) => [...document.querySelectorAll(
            "#pst-primary-sidebar-modal nav a")].some(a => a.pathname.endsWith(path)
            && a.checkVisibility() && a.getBoundingClientRect().right > 0)""",
            arg=f"/{edition}/76-collectives.html", timeout=5000)  # the dialog slides in
        wait_at_the_menu_button_edge(v.page, edition)  # ... from the edge of the ☰ button
        # The bilingual title in the open menu still reads in order.
        xy = v.page.evaluate(WORD_XY, ["#pst-primary-sidebar-modal .logo__title", TITLE_WORDS])
        assert reading_order({k: xy[k] for k in ("amoozesh", "dar", "pytorch_fa")}, "rtl") == \
            ["amoozesh", "dar", "pytorch_fa"], xy
        assert reading_order({k: xy[k] for k in ("distributed", "training")}, "ltr") == \
            ["distributed", "training"], xy
        shoot(v, f"phone-menu-{edition}")
        v.page.keyboard.press("Escape")
        v.page.wait_for_selector("#pst-primary-sidebar-modal:not([open])", state="attached")

        visible_button(v.page, "secondary").click()
        v.page.wait_for_selector("#pst-secondary-sidebar-modal[open]", timeout=5000)
        entries = v.page.locator("#pst-secondary-sidebar-modal .toc-entry a")
        entries.filter(visible=True).first.wait_for(timeout=5000)
        assert entries.count() > 3
        shoot(v, f"phone-contents-{edition}")
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition", EDITIONS)
def test_in_a_narrow_window_the_menu_opens_on_the_side_of_its_button(browser, site, edition):
    """975 px: too narrow for sphinx-book-theme's sidebar (992), wide enough for
    pydata-sphinx-theme's (960), so ☰ opens the phone's dialog on a desktop layout."""
    v = open_at(browser, f"{site}/notebooks/{edition}/78-zero.html", NARROW)
    try:
        visible_button(v.page, "primary").click()
        v.page.wait_for_selector("#pst-primary-sidebar-modal[open]", timeout=5000)
        wait_at_the_menu_button_edge(v.page, edition)
        shoot(v, f"narrow-menu-{edition}")
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition", EDITIONS)
def test_on_a_desktop_the_menu_button_hides_and_shows_the_primary_sidebar(browser, site, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/78-zero.html", DESKTOP)
    try:
        sidebar = v.page.locator("#pst-primary-sidebar")
        assert sidebar.is_visible()
        visible_button(v.page, "primary").click()
        hidden = "getComputedStyle(document.getElementById('pst-primary-sidebar')).visibility"
        v.page.wait_for_function(f"{hidden} === 'hidden'", timeout=5000)
        column = box(v.page, "article.bd-article")
        assert column["width"] > 900, column  # the article takes its place
        assert v.page.locator("dialog[open]").count() == 0  # toggled in place, no modal
        shoot(v, f"desktop-sidebar-hidden-{edition}")
        visible_button(v.page, "primary").click()
        v.page.wait_for_function(f"{hidden} === 'visible'", timeout=5000)
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        v.page.context.close()


# --- 2. Latin runs inside Persian sentences ----------------------------------------------------

MARK_TEXT = """([scope, text]) => {
    const element = [...document.querySelectorAll(scope)].find(e => e.textContent.includes(text));
    if (element) element.setAttribute("data-test-text", "");
    return Boolean(element);
}"""


@pytest.mark.parametrize("page, scope, first, joint, second", [
    ("notebooks/fa/78a-zero-stages", "article h1", "ZeRO-2", " و ", "ZeRO-3"),
    ("notebooks/fa/78a-zero-stages", ".bd-sidebar-primary nav li", "ZeRO-2", " و ", "ZeRO-3"),
    ("en/intro", ".bd-sidebar-primary nav li", "ZeRO-2", " و ", "ZeRO-3"),
    ("notebooks/en/76-collectives", ".bd-sidebar-primary nav li", "GPipe", " و ", "1F1B"),
    ("notebooks/fa/76-collectives", "article p, article li", "gloo", "، ", "NCCL"),
])
def test_two_latin_runs_joined_in_persian_keep_their_order(browser, site, page, scope, first,
                                                           joint, second):
    """Two Latin names joined by a Persian word or the Persian comma, in a heading, the
    navigation and the prose, are drawn in reading order."""
    v = open_at(browser, f"{site}/{page}.html", DESKTOP)
    try:
        assert v.page.evaluate(MARK_TEXT, [scope, f"{first}{joint}{second}"]), f"no {first}{joint}{second}"
        # Measured where a reader sees it: a lesson's optional pages sit in a closed <details>
        # of the navigation on other pages, whose hidden text Chromium gives no reliable boxes
        # (0, 0 for one word, a stale place for the other); open it, as a reader would, and
        # bring it into view.
        v.page.evaluate("() => document.querySelectorAll('[data-test-text] details')"
                        ".forEach(d => { d.open = true; })")
        v.page.locator("[data-test-text]").first.scroll_into_view_if_needed()
        xy = v.page.evaluate(WORD_XY, ["[data-test-text]", {"first": {"text": first},
                                                            "second": {"text": second}}])
        assert reading_order(xy, "rtl") == ["first", "second"], xy
        shoot(v, "mixed-runs-" + page.replace("/", "-") + ("-nav" if "nav" in scope else ""))
    finally:
        v.page.context.close()


# Every Latin word with a hyphen in the element: where its first letter and the letter after
# each hyphen are drawn.
HYPHEN_XY = """(selector) => {
    const element = document.querySelector(selector);
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    const at = (node, i) => { const r = document.createRange(); r.setStart(node, i);
        r.setEnd(node, i + 1); const b = r.getBoundingClientRect();
        return [b.left + b.width / 2, b.top + b.height / 2]; };
    const words = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const m of node.data.matchAll(/[A-Za-z]+(?:-[A-Za-z]+)+/g)) {
            const parts = [at(node, m.index)];
            let offset = m.index;
            for (const piece of m[0].split("-").slice(0, -1)) {
                offset += piece.length + 1; parts.push(at(node, offset)); }
            words.push([m[0], parts]);
        }
    }
    return words;
}"""


@pytest.mark.parametrize("edition", EDITIONS)
def test_hyphenated_words_read_in_order_and_stay_whole_on_a_phone(browser, site, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/76-collectives.html", PHONE)
    try:
        words = v.page.evaluate(HYPHEN_XY, "article .admonition")
        assert len(words) >= 3, words  # all-reduce, reduce-scatter, all-gather
        for word, parts in words:
            keys = [f"{i}" for i in range(len(parts))]
            order = reading_order(dict(zip(keys, parts, strict=True)), "ltr")
            assert order == keys, (word, parts)  # left to right in both editions
            if edition == "fa":  # and on one line: no break at a hyphen inside a Persian line
                assert max(y for _, y in parts) - min(y for _, y in parts) < 4, (word, parts)
        v.page.locator("article .admonition").first.scroll_into_view_if_needed()
        shoot(v, f"hyphens-76-{edition}-phone")
        assert not v.blocked and not v.console, (v.blocked, v.console)
    finally:
        v.page.context.close()


# --- 6. Search ---------------------------------------------------------------------------------

def search(browser, site: str, query: str, edition: str) -> Visit:
    v = open_at(browser, f"{site}/search.html?q={quote(query)}&edition={edition}", DESKTOP)
    v.page.wait_for_function("""() => { const s = document.querySelector("#search-results p");
        return s && /[0-9۰-۹]/.test(s.textContent); }""", timeout=30_000)
    # The previews arrive one by one, each after its page is fetched.
    v.page.wait_for_function("""() => [...document.querySelectorAll("#search-results ul.search li")]
        .every(li => li.querySelector("p.context"))""", timeout=30_000)
    return v


def results(v: Visit) -> list[dict]:
    return v.page.eval_on_selector_all("#search-results ul.search li", """items => items.map(li =>
        ({path: li.querySelector("a").pathname, dir: getComputedStyle(li).direction,
          preview: li.querySelector("p.context").textContent,
          align: getComputedStyle(li.querySelector("p.context")).textAlign}))""")


def test_arabic_yeh_and_kaf_find_the_persian_words(browser, site):
    found = {}
    for query in ("بهینه‌ساز", "بهينه‌ساز", "كار"):  # Persian, Arabic yeh, Arabic kaf
        v = search(browser, site, query, "fa")
        try:
            found[query] = [r["path"] for r in results(v)]
            if query == "بهينه‌ساز":
                shoot(v, "search-arabic-letters-fa")
            assert not v.blocked and not v.console, (v.blocked, v.console)
        finally:
            v.page.context.close()
    assert found["بهينه‌ساز"] == found["بهینه‌ساز"] and len(found["بهینه‌ساز"]) >= 5, found
    assert found["كار"], found


@pytest.mark.parametrize("edition, query", [("fa", "حافظه"), ("en", "memory")])
def test_search_previews_are_the_pages_own_text_in_its_direction(browser, site, edition, query):
    v = search(browser, site, query, edition)
    try:
        hits = results(v)
        assert hits, hits
        for hit in hits:
            assert not re.search("Run this lesson|اجرای این درس", hit["preview"]), hit
            assert not re.match(r"(\.\.\.)?\s*(English|فارسی)\b", hit["preview"]), hit  # the switch
            if f"/{edition}/" in hit["path"]:
                assert hit["dir"] == ("rtl" if edition == "fa" else "ltr"), hit
                assert hit["align"] in (("start", "right") if edition == "fa" else ("start", "left")), hit
        if edition == "fa":  # every Latin run of a Persian preview is isolated
            loose = v.page.evaluate("""() => {
                const out = [];
                for (const p of document.querySelectorAll("#search-results li[dir=rtl] p.context")) {
                    const walker = document.createTreeWalker(p, NodeFilter.SHOW_TEXT);
                    for (let n = walker.nextNode(); n; n = walker.nextNode())
                        if (/[A-Za-z]/.test(n.data) && !n.parentElement.closest("bdi[dir=ltr]"))
                            out.push(n.data);
                }
                return out; }""")
            assert not loose, loose
        shoot(v, f"search-previews-{edition}")
    finally:
        v.page.context.close()


# --- 7. Right-to-left geometry -----------------------------------------------------------------

@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("edition", EDITIONS)
def test_the_switch_and_the_run_box_stay_in_the_text_column(browser, site, edition, size):
    v = open_at(browser, f"{site}/notebooks/{edition}/77-ddp.html", size)
    try:
        column = v.page.evaluate("""() => { const a = document.querySelector("article.bd-article");
            const r = a.getBoundingClientRect(), s = getComputedStyle(a);
            return [r.left + parseFloat(s.paddingLeft), r.right - parseFloat(s.paddingRight)]; }""")
        for selector in ("nav.edition-switch", "aside.run-lesson"):
            edges = box(v.page, selector)
            assert column[0] - 1 <= edges["left"] and edges["right"] <= column[1] + 1, (
                selector, edges, column)
    finally:
        v.page.context.close()


@pytest.mark.parametrize("url", ["fa/glossary.html", "en/glossary.html",
                                 "search.html?q=rank&edition=fa", "search.html?q=rank&edition=en"])
def test_the_text_column_sits_beside_the_site_navigation(browser, site, url):
    v = open_at(browser, f"{site}/{url}", DESKTOP)
    try:
        persian = "fa" in url
        if "search" in url:
            v.page.wait_for_selector("#search-results ul.search li")
        sidebar = box(v.page, "#pst-primary-sidebar")
        column = box(v.page, ".bd-article-container")
        if persian:
            assert abs(column["right"] - sidebar["left"]) < 2, (sidebar, column)
        else:
            assert abs(column["left"] - sidebar["right"]) < 2, (sidebar, column)
        shoot(v, "column-" + re.sub(r"[^a-z]+", "-", url.replace(".html", "")).strip("-"))
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition", EDITIONS)
def test_previous_and_next_and_the_contents_bar_follow_the_direction(browser, site, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/78-zero.html", DESKTOP)
    try:
        prev, following = box(v.page, ".prev-next-area a.left-prev"), \
            box(v.page, ".prev-next-area a.right-next")
        # Arrows point outwards: the previous one towards the page's start, the next towards its end.
        arrows = v.page.eval_on_selector_all(".prev-next-area a :is(i, svg)", """icons => icons.map(
            i => { const r = i.getBoundingClientRect(); return r.left + r.width / 2; })""")
        if edition == "fa":
            assert prev["left"] > following["right"], (prev, following)
            assert arrows[0] > prev["left"] + prev["width"] / 2, arrows  # on the outer side
        else:
            assert prev["right"] < following["left"], (prev, following)
            assert arrows[0] < prev["left"] + prev["width"] / 2, arrows
        # The current section's bar, on the side where the contents' lines start.
        link = v.page.locator(".bd-sidebar-secondary .toc-entry a.nav-link").nth(2)
        link.evaluate("a => a.classList.add('active')")
        shadow = link.evaluate("a => getComputedStyle(a).boxShadow")
        offset = float(re.search(r"\)\s+(-?[\d.]+)px", shadow).group(1))  # rgb(...) x y ... inset
        assert (offset < 0) == (edition == "fa"), shadow
        # The same for the current page in the site navigation.
        shadow = v.page.eval_on_selector("nav.bd-links li.current > a",
                                         "a => getComputedStyle(a).boxShadow")
        offset = float(re.search(r"\)\s+(-?[\d.]+)px", shadow).group(1))
        assert (offset < 0) == (edition == "fa"), shadow
        v.page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        shoot(v, f"prev-next-{edition}")
    finally:
        v.page.context.close()


@pytest.mark.parametrize("edition", EDITIONS)
def test_persian_emphasis_is_not_slanted(browser, site, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/78-zero.html", DESKTOP)
    try:
        styles = v.page.eval_on_selector_all("article.bd-article p em, article.bd-article li em",
                                             "ems => ems.map(e => getComputedStyle(e).fontStyle)")
        assert styles, "no emphasis on the page"
        assert set(styles) == ({"normal"} if edition == "fa" else {"italic"}), styles
    finally:
        v.page.context.close()


# --- 8. What the cells print -------------------------------------------------------------------

# Every line of every output <pre> of the page: its first strong letter's script, where its first
# character is drawn against the <pre>'s content edges, and where each Persian word or number of
# its first visual line is drawn, in logical order.
OUTPUT_LINES = r"""() => {
    const lines = [];
    const at = (node, i) => { const r = document.createRange(); r.setStart(node, i);
        r.setEnd(node, i + 1); return r.getBoundingClientRect(); };
    for (const pre of document.querySelectorAll("article .cell_output pre")) {
        const box = pre.getBoundingClientRect(), style = getComputedStyle(pre);
        const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
        const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            let start = 0;
            for (const line of node.data.split("\n")) {
                const strong = line.match(/[A-Za-z\u0600-\u06ff]/);
                const first = line.length && strong && !/[\u06f0-\u06f9]/.test(strong[0]) ? at(node, start) : null;
                if (first) {
                    const words = [];
                    for (const m of line.matchAll(/[\u0600-\u06ff\u200c]+/g)) {
                        const b = at(node, start + m.index);
                        if (Math.abs(b.top - first.top) < 4) words.push([m[0], b.left + b.width / 2]);
                    }
                    lines.push({text: line, persian: /[\u0600-\u06ff]/.test(strong[0]),
                                first: [first.left, first.right], edges: [left, right], words});
                }
                start += line.length + 1;
            }
        }
    }
    return lines;
}"""


# Where the number of each check's line of a Persian practice report is drawn ("۱. [قبول] ..."),
# against the right content edge of its <pre>: (the line's start, the number's right, the edge).
NUMBERED_LINES = r"""(selector) => {
    const out = [];
    for (const pre of document.querySelectorAll(selector)) {
        const box = pre.getBoundingClientRect(), edge = box.right - parseFloat(getComputedStyle(pre).paddingRight);
        const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            let start = 0;
            for (const line of node.data.split("\n")) {
                const m = line.match(/^\u200f?[\u06f0-\u06f9]+\. \[/);
                if (m) {
                    const i = start + m[0].search(/[\u06f0-\u06f9]/), r = document.createRange();
                    r.setStart(node, i); r.setEnd(node, i + 1);
                    out.push([line.slice(0, 12), r.getBoundingClientRect().right, edge]);
                }
                start += line.length + 1;
            }
        }
    }
    return out;
}"""


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_a_quoted_practice_report_reads_in_its_own_direction(browser, site, size):
    """Each Persian lesson quotes the practice command's report in a plain-text block of its
    prose: its Persian lines start at the right edge and read right to left, as printed lines
    do (rtl.css), each check's number included (practice.report.LINE_START), and no line runs
    out of the block, on a desktop or a phone."""
    v = open_at(browser, f"{site}/notebooks/fa/76-collectives.html", size)
    try:
        lines = v.page.evaluate(OUTPUT_LINES.replace("article .cell_output pre",
                                                     "article .highlight-text pre"))
        persian = [line for line in lines if line["persian"]]
        assert len(persian) >= 3, lines
        for line in persian:
            (_, first_right), (_, right) = line["first"], line["edges"]
            assert abs(first_right - right) < 2, line  # starts at the right edge
            xs = [x for word, x in line["words"] if re.search("[\u0621-\u06d3]", word)]
            assert xs == sorted(xs, reverse=True), line  # its words read right to left
        numbered = v.page.evaluate(NUMBERED_LINES, "article .highlight-text pre")
        assert len(numbered) >= 3 and all(abs(x - edge) < 2 for _, x, edge in numbered), numbered
        overflow = v.page.eval_on_selector_all(
            "article .highlight-text pre", "pres => pres.map(p => p.scrollWidth - p.clientWidth)")
        assert overflow and max(overflow) <= 1, overflow
        v.page.locator("article .highlight-text pre").first.scroll_into_view_if_needed()
        shoot(v, f"practice-report-76-fa-{'phone' if size is PHONE else 'desktop'}")
    finally:
        v.page.context.close()


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_each_printed_line_reads_in_its_own_direction(browser, site, size):
    """Lesson 81 prints Persian lines (the checkpoint's summary, the resume checks) and Latin
    ones (RESUME VERIFIED, file names): a Persian line starts at the right edge and its words
    and numbers read right to left; a Latin line starts at the left edge."""
    v = open_at(browser, f"{site}/notebooks/fa/81-capstone.html", size)
    try:
        lines = v.page.evaluate(OUTPUT_LINES)
        persian = [line for line in lines if line["persian"]]
        assert len(persian) >= 3 and len(lines) > len(persian), lines
        for line in lines:
            (first_left, first_right), (left, right) = line["first"], line["edges"]
            if line["persian"]:
                assert abs(first_right - right) < 2, line  # starts at the right edge
                xs = [x for _, x in line["words"]]
                assert len(xs) >= 1 and xs == sorted(xs, reverse=True), line  # read right to left
            else:
                assert abs(first_left - left) < 2, line
        v.page.locator("article .cell_output pre", has_text="RESUME VERIFIED").first.scroll_into_view_if_needed()
        shoot(v, f"printed-lines-81-fa-{'phone' if size is PHONE else 'desktop'}")
    finally:
        v.page.context.close()
