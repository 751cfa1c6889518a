"""The explorers' words in headless Chromium: Latin runs inside Persian text keep their order, and
a value stays on one line beside its term.

- Persian edition: every Latin run (a file name, a function, a unit) in an explorer's Persian
  text stands in a left-to-right isolate (U+2066 ... U+2069, or a <bdi dir="ltr">), so it reads
  in order on the page and when copied; lesson 80's crash explorer is checked by the positions
  of its characters (the hidden folder's leading dot stays first).
- English edition, 1280 px: lesson 77's values ("14 ms") are not broken across two lines.
- Both editions, on a phone: the note under an explorer that says where its constants were
  measured wraps inside the explorer, and the Persian one names the machine in Persian words.

Positions are asked of the browser (WORD_XY, reading_order from test_browser.py).
"""

from __future__ import annotations

import pytest

from test_browser import WORD_XY, browser, open_at, reading_order, site  # noqa: F401 (fixtures)
from test_reading import DESKTOP, PHONE, shoot

pytestmark = pytest.mark.book

EXPLORER_LESSONS = ["76-collectives", "77-ddp", "78a-zero-stages", "79-pipeline", "80-checkpoint",
                    "81-capstone"]

# Text nodes of an explorer that hold a Persian letter and a Latin letter outside an isolate.
LOOSE_LATIN = """(host) => {
    const loose = [];
    const walker = document.createTreeWalker(document.querySelector(host), NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (node.parentElement.closest("bdi[dir=ltr], pre, code, [dir=ltr]")) continue;
        if (!/[\\u0621-\\u064a\\u067e-\\u06d3]/.test(node.data)) continue;
        const outside = node.data.replace(/\\u2066[^\\u2069]*\\u2069/g, "");
        if (/[A-Za-z]/.test(outside)) loose.push(node.data);
    }
    return loose;
}"""


@pytest.mark.parametrize("lesson", EXPLORER_LESSONS)
def test_every_latin_run_in_a_persian_explorer_is_isolated(browser, site, lesson):
    v = open_at(browser, f"{site}/notebooks/fa/{lesson}.html", PHONE)
    try:
        host = f"div.explorer[data-explorer='{lesson.split('-')[0]}']"
        v.page.wait_for_selector(f"{host} *")
        assert not v.page.evaluate(LOOSE_LATIN, host)
        for control in v.page.locator(f"{host} input[type=range]").all():  # and after a change
            control.focus()
            control.press("ArrowUp")
        assert not v.page.evaluate(LOOSE_LATIN, host)
    finally:
        v.page.context.close()


def test_the_crash_explorer_reads_file_names_in_order_on_a_phone(browser, site):
    v = open_at(browser, f"{site}/notebooks/fa/80-checkpoint.html", PHONE)
    try:
        explorer = "div.explorer[data-explorer='80']"
        v.page.locator(f"{explorer} input[name=crash_after]").fill("2")
        first = f"{explorer} li:nth-child(1)"  # «پوشهٔ پنهان .step-00000002.tmp را می‌سازد»
        xy = v.page.evaluate(WORD_XY, [first, {"hidden": {"text": "پنهان"}, "dot": {"text": ".step"},
                                               "s": {"text": "step"}, "tmp": {"text": "tmp"},
                                               "ra": {"text": "را"}}])
        assert reading_order({k: xy[k] for k in ("hidden", "dot", "ra")}, "rtl") == \
            ["hidden", "dot", "ra"], xy  # the file name between the words around it
        assert reading_order({k: xy[k] for k in ("dot", "s", "tmp")}, "ltr") == \
            ["dot", "s", "tmp"], xy  # and its leading dot first, left to right
        second = f"{explorer} li:nth-child(2)"  # «.owner را می‌نویسد (با نام موقت، fsync، تغییر نام)»
        xy = v.page.evaluate(WORD_XY, [second, {"dot": {"text": ".owner"}, "o": {"text": "owner"},
                                                "ra": {"text": "را"}, "temporary": {"text": "موقت"},
                                                "fsync": {"text": "fsync"},
                                                "rename": {"text": "تغییر"}}])
        assert reading_order({k: xy[k] for k in ("dot", "o")}, "ltr") == ["dot", "o"], xy
        assert reading_order({k: xy[k] for k in ("ra", "temporary", "fsync", "rename")}, "rtl") == \
            ["ra", "temporary", "fsync", "rename"], xy
        v.page.locator(first).scroll_into_view_if_needed()
        shoot(v, "explorer-80-file-names-fa-phone")
    finally:
        v.page.context.close()


# Each number of a <dl class="explorer__facts"> (a dd of text with a digit): the top of its first
# and last character, and its right edge against the explorer's.
VALUE_LINES = """(host) => [...document.querySelectorAll(host + " .explorer__facts dd")]
        .filter((dd) => !dd.children.length && /[0-9۰-۹]/.test(dd.textContent)).map((dd) => {
    const node = [...dd.childNodes].find((n) => n.nodeType === 3 && n.data.trim());
    const at = (i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
        return r.getBoundingClientRect(); };
    return {text: node.data, first: at(0).top, last: at(node.data.length - 1).top,
            right: dd.getBoundingClientRect().right,
            edge: document.querySelector(host).getBoundingClientRect().right};
})"""


@pytest.mark.parametrize("lesson, edition", [("77-ddp", "en"), ("77-ddp", "fa"),
                                             ("76-collectives", "en"), ("81-capstone", "en")])
def test_an_explorers_values_stay_on_one_line_at_1280_px(browser, site, lesson, edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/{lesson}.html", DESKTOP)
    try:
        host = f"div.explorer[data-explorer='{lesson[:2]}']"
        v.page.wait_for_selector(f"{host} dd")
        values = v.page.evaluate(VALUE_LINES, host)
        assert values, "no values"
        for value in values:
            assert abs(value["first"] - value["last"]) < 2, value  # "14 ms" on one line
            assert value["right"] <= value["edge"] + 1, value  # inside the explorer
        v.page.locator(host).scroll_into_view_if_needed()
        shoot(v, f"explorer-{lesson[:2]}-values-{edition}-desktop")
    finally:
        v.page.context.close()


# Each note under an explorer: its right edge and the widest line it holds, against the explorer's.
NOTE_EDGES = """(host) => [...document.querySelectorAll(host + " .explorer__note")].map((note) => ({
    text: note.textContent, right: Math.max(...[...note.getClientRects()].map((r) => r.right),
        ...[...note.querySelectorAll("*")].flatMap((e) => [...e.getClientRects()].map((r) => r.right))),
    edge: document.querySelector(host).getBoundingClientRect().right}))"""


@pytest.mark.parametrize("edition", ["en", "fa"])
@pytest.mark.parametrize("lesson", ["76-collectives", "77-ddp", "81-capstone"])
def test_the_machine_note_wraps_on_a_phone_and_speaks_the_pages_language(browser, site, lesson,
                                                                         edition):
    v = open_at(browser, f"{site}/notebooks/{edition}/{lesson}.html", PHONE)
    try:
        host = f"div.explorer[data-explorer='{lesson[:2]}']"
        v.page.wait_for_selector(f"{host} .explorer__note")
        notes = v.page.evaluate(NOTE_EDGES, host)
        measured = [note for note in notes if "2 cores" in note["text"] or "۲ هسته" in note["text"]]
        assert measured, notes  # the note that names the machine
        for note in measured:
            assert note["right"] <= note["edge"] + 1, note  # wrapped, not cut at the edge
            if edition == "fa":
                assert "cores" not in note["text"] and "load average" not in note["text"], note
        v.page.locator(f"{host} .explorer__note").last.scroll_into_view_if_needed()
        shoot(v, f"explorer-{lesson[:2]}-note-{edition}-phone")
    finally:
        v.page.context.close()
