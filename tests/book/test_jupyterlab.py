"""The lessons in JupyterLab, in headless Chromium: prose right-to-left, MyST rendered, the widget live.

JupyterLab has no right-to-left setting: Persian notebooks wrap each markdown cell's prose in
<div dir="rtl"> ... </div> (a blank line after the opening tag and before the closing one), and
`make lab` loads book/static/jupyterlab-rtl.css as JupyterLab's custom.css, which aligns that
prose to the right. jupyterlab-myst (the lab extra) renders the lessons' MyST: no label line,
directive option, role or fence is shown as typed. Inside the Persian wrapper it draws plain HTML
(formulas as TeX, admonitions without its styling), which custom.css keeps in order and styles,
and the lesson's title is shown once; JupyterLab does not ask to fetch its news from the
internet (book/static/jupyterlab-settings.json). The server runs here as `make lab` runs it, on
a copy of the lesson (running a cell must not rewrite the repository's notebook), with every
request to another host blocked. Screenshots go to _build/screenshots/.

Skipped, with the reason, when JupyterLab, Playwright or Chromium is missing on a developer
machine; fails instead when the environment variable CI is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
LESSON = ROOT / "notebooks" / "fa" / "78-zero.ipynb"
CHROMIUM = Path("/usr/bin/chromium-headless-shell")
SCREENSHOTS = ROOT / "_build" / "screenshots"
SETTINGS = ROOT / "book" / "static" / "jupyterlab-settings.json"  # make lab's defaults
TOKEN = "lesson-code-test"
START_TIMEOUT_S = 120
KERNEL_TIMEOUT_MS = 240_000  # the lesson's imports (torch, pandas) on a busy 2-core machine
WRAPPER = '<div dir="rtl">'
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen
# a rendered markdown cell: JupyterLab's renderer, or jupyterlab-myst's (class "myst")
MARKDOWN = f"{PANEL} :is(.jp-MarkdownOutput, .jp-MarkdownCell .myst)"
# MyST as typed, in the text a reader sees: a label line "(lesson-78-fa)=", a directive's option
# ":class: tip", a fence "```{admonition}" or ":::{note}", a role "{doc}`...`"
RAW_MYST = re.compile(r"^\([\w-]+\)=\s*$|^:[a-z-]+:(\s|$)|^(`{3,}|:{3,})\{|\{[a-z-]+\}`", re.MULTILINE)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the JupyterLab checks must run")
    pytest.skip(reason)


def wrap_prose(notebook: dict) -> dict:
    """The notebook with every markdown cell wrapped as the Persian lessons wrap their prose."""
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            if not source.startswith(WRAPPER):
                cell["source"] = f"{WRAPPER}\n\n{source}\n\n</div>"
    return notebook


def is_wrapped(notebook: dict) -> bool:
    return all("".join(c["source"]).startswith(WRAPPER)
               for c in notebook["cells"] if c["cell_type"] == "markdown")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab as `make lab` starts it, on a scratch root; yields (base URL, root)."""
    jupyter = Path(sys.executable).with_name("jupyter")
    try:
        import jupyterlab  # noqa: F401
        import jupyterlab_myst  # noqa: F401
    except ImportError:
        _unavailable('JupyterLab or jupyterlab-myst is not installed (make lab, or pip install -e ".[lab]")')
    root = tmp_path_factory.mktemp("lab")
    config = root / "config"
    (config / "custom").mkdir(parents=True)
    shutil.copy(ROOT / "book" / "static" / "jupyterlab-rtl.css", config / "custom" / "custom.css")
    (config / "labconfig").mkdir()
    shutil.copy(SETTINGS, config / "labconfig" / "default_setting_overrides.json")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (root / "notebooks" / "fa").mkdir(parents=True)
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root / 'notebooks'}",
         "--LabApp.custom_css=True", "--LabApp.extension_manager=readonly", "--allow-root"],
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(config)}, stdout=log, stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                _unavailable(f"JupyterLab did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    try:
        yield base, root / "notebooks"
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing (Debian: apt-get install chromium-headless-shell)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable('playwright is not installed (pip install -e ".[test]")')
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


def open_notebook(browser, base: str, path: str, blocked: list[str]):
    """A page with `path` open in JupyterLab, its markdown rendered; other hosts blocked."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    def route(r) -> None:
        if urlparse(r.request.url).hostname in {"127.0.0.1", "localhost"}:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    # reset: a fresh workspace, so that no notebook of an earlier test is restored beside it
    page.goto(f"{base}/lab/tree/{path}?reset&token={TOKEN}")
    page.wait_for_selector(f"{MARKDOWN} p", timeout=START_TIMEOUT_S * 1000)
    return page


PROSE = f"""() => [...document.querySelectorAll("{MARKDOWN} p")]
    .filter(p => (p.textContent.match(/[\\u0600-\\u06FF]/g) || []).length > 20)
    .map(p => [getComputedStyle(p).direction, getComputedStyle(p).textAlign])"""


def assert_persian_prose_right_to_left(page) -> None:
    # JupyterLab renders only the cells near the view, one after another: wait for three of them
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => ({PROSE})().length >= 3", timeout=START_TIMEOUT_S * 1000)
    except PlaywrightTimeout:
        pass  # the assertion below says how many there were
    prose = page.evaluate(PROSE)
    assert len(prose) >= 3, f"found only {len(prose)} Persian paragraphs"
    wrong = [style for style in prose if style != ["rtl", "right"]]
    assert not wrong, f"{len(wrong)} of {len(prose)} Persian paragraphs are not right-to-left: {wrong[:3]}"


def test_wrapped_persian_prose_is_right_to_left_and_the_calculator_runs(lab, browser) -> None:
    base, root = lab
    notebook = wrap_prose(json.loads(LESSON.read_text(encoding="utf-8")))
    (root / "fa" / "wrapped.ipynb").write_text(json.dumps(notebook, ensure_ascii=False), "utf-8")
    blocked: list[str] = []
    page = open_notebook(browser, base, "fa/wrapped.ipynb", blocked)
    try:
        assert_persian_prose_right_to_left(page)
        assert page.evaluate("getComputedStyle(document.querySelector('.jp-CodeCell .cm-content')).direction") == "ltr"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-fa-78-wrapped.png"))
        run_calculator(page)
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-fa-78-calculator.png"))
        assert not blocked, f"JupyterLab tried to reach other hosts: {blocked}"
    finally:
        page.close()


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks" / "fa").glob("*.ipynb")),
                         ids=lambda path: path.name)
def test_every_persian_notebook_wraps_its_prose(notebook: Path) -> None:
    assert is_wrapped(json.loads(notebook.read_text(encoding="utf-8"))), (
        f"wrap each markdown cell of {notebook.name} in {WRAPPER} ... </div>, as the others are")


def test_the_check_finds_a_cell_that_is_not_wrapped() -> None:
    cells = [{"cell_type": "markdown", "source": f"{WRAPPER}\n\nمتن\n\n</div>"},
             {"cell_type": "markdown", "source": "متن"}]
    assert is_wrapped({"cells": cells[:1]}) and not is_wrapped({"cells": cells})


def test_the_persian_lesson_reads_right_to_left(lab, browser) -> None:
    base, root = lab
    shutil.copy(LESSON, root / "fa" / LESSON.name)
    blocked: list[str] = []
    page = open_notebook(browser, base, f"fa/{LESSON.name}", blocked)
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-fa-78.png"))
        assert not blocked, f"JupyterLab tried to reach other hosts: {blocked}"
        assert_persian_prose_right_to_left(page)
    finally:
        page.close()


def test_jupyterlab_neither_asks_to_fetch_news_nor_checks_for_updates(lab) -> None:
    """The settings JupyterLab's front end receives are make lab's defaults: no toast asking to
    fetch Jupyter's news from the internet covers the lesson (it would in the screenshots above)."""
    base, _ = lab
    url = f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification?token={TOKEN}"
    with urllib.request.urlopen(url, timeout=30) as response:
        plugin = json.load(response)
    # Overrides become the schema's defaults; the reader's own settings (none here) win over them.
    shown = {key: plugin["settings"].get(key, spec.get("default"))
             for key, spec in plugin["schema"]["properties"].items()}
    wanted = json.loads(SETTINGS.read_text(encoding="utf-8"))["@jupyterlab/apputils-extension:notification"]
    assert {key: shown[key] for key in wanted} == wanted == {"fetchNews": "false",
                                                             "checkForUpdates": False}, shown


def run_cell(page, cell) -> None:
    """Run `cell` as a reader does (click into it, Shift+Enter) and wait until it has run.

    The key goes to the active cell: pressed before the click has made `cell` active (a notebook
    still settling), it would run another cell, so the press waits for that. Then the cell's
    prompt shows its execution count; an error it printed fails the test with its text.
    """
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputArea-editor").click()
    cell.and_(page.locator(".jp-Cell.jp-mod-active")).wait_for(timeout=START_TIMEOUT_S * 1000)
    page.keyboard.press("Shift+Enter")
    cell.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]")).wait_for(
        timeout=KERNEL_TIMEOUT_MS)
    errors = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not errors.count(), f"the cell raised: {errors.first.inner_text()[-2000:]}"


def run_calculator(page) -> None:
    """Run the lesson's first code cell (its imports), then the calculator's; see its widget."""
    run_cell(page, page.locator(f"{PANEL} .jp-CodeCell").first)
    cell = page.locator(f"{PANEL} .jp-CodeCell", has_text="widgets.memory_calculator()").first
    run_cell(page, cell)
    widget = cell.locator(".widget-interact").first
    widget.wait_for(timeout=KERNEL_TIMEOUT_MS)
    text = widget.inner_text()
    assert "P (billions)" in text and "ZeRO-1" in text, text
    cell.scroll_into_view_if_needed()


# Every markdown cell's shown text, scrolling the notebook from top to bottom (JupyterLab renders
# only the cells near the view): [[cell index, text], ...]. After each half-screen scroll it waits
# until the markdown cells in view have drawn their text and their number has held for two polls
# (JupyterLab adds the cells on a later frame, jupyterlab-myst renders them after that), at most
# STEP_MS; a cell missed there is caught by the count the test compares.
SHOWN_MARKDOWN = f"""async () => {{
  const STEP_MS = 3000, POLL_MS = 40;
  const panel = document.querySelector("{PANEL}");
  const scroller = panel.querySelector(".jp-WindowedPanel-outer");
  const frame = () => new Promise(done => requestAnimationFrame(() => done()));
  const inView = () => {{
    const view = scroller.getBoundingClientRect();
    return [...panel.querySelectorAll(".jp-MarkdownCell")].filter(cell => {{
      const box = cell.getBoundingClientRect();
      return box.bottom > view.top && box.top < view.bottom; }});
  }};
  const shown = cell => cell.querySelector(".myst, .jp-MarkdownOutput");
  const drawn = cell => Boolean(shown(cell) && shown(cell).innerText.trim());
  const seen = new Map();
  for (let top = 0; ; top += scroller.clientHeight / 2) {{
    scroller.scrollTop = top;
    await frame(); await frame();
    for (let waited = 0, before = -1; waited < STEP_MS; waited += POLL_MS) {{
      const cells = inView();
      if (cells.length === before && cells.every(drawn)) break;
      before = cells.length;
      await new Promise(done => setTimeout(done, POLL_MS));
    }}
    panel.querySelectorAll(".jp-MarkdownCell").forEach(cell => {{
      if (drawn(cell)) seen.set(cell.getAttribute("data-windowed-list-index"), shown(cell).innerText);
    }});
    if (top + scroller.clientHeight >= scroller.scrollHeight) break;
  }}
  return [...seen.entries()];
}}"""


# The first markdown cell as drawn: the headings a reader sees (display: none ones left out),
# the direction of each inline formula, and the width of the admonition's bar.
FIRST_MARKDOWN = f'{PANEL} .jp-MarkdownCell[data-windowed-list-index="0"]'
FIRST_CELL = f"""() => {{
  const cell = document.querySelector('{FIRST_MARKDOWN}');
  const aside = cell.querySelector("aside");
  return {{
    titles: [...cell.querySelectorAll("h1")].filter(h => h.getClientRects().length)
      .map(h => h.textContent.trim()),
    formulas: [...cell.querySelectorAll(".math-inline")].map(m => getComputedStyle(m).direction),
    admonition_bar: aside ? getComputedStyle(aside).borderInlineStartWidth : "",
  }};
}}"""


@pytest.mark.parametrize("edition", ["fa", "en"])
def test_no_raw_myst_is_shown(lab, browser, edition: str) -> None:
    """Lesson 78 (a label, an admonition, literalinclude, {doc} links) in each edition: every
    markdown cell rendered by jupyterlab-myst, none showing MyST as typed, the title once; in
    Persian, the first cell's formulas left-to-right and its admonition with a bar."""
    base, root = lab
    lesson = ROOT / "notebooks" / edition / LESSON.name
    (root / edition).mkdir(exist_ok=True)
    shutil.copy(lesson, root / edition / LESSON.name)
    cells = json.loads(lesson.read_text(encoding="utf-8"))["cells"]
    markdown_cells = sum(c["cell_type"] == "markdown" for c in cells)
    title = next((line[2:].strip() for line in "".join(cells[0]["source"]).splitlines()
                  if line.startswith("# ")), None)
    assert title, f"{edition}/{LESSON.name}: its first cell has no '# ' title line"
    blocked: list[str] = []
    page = open_notebook(browser, base, f"{edition}/{LESSON.name}", blocked)
    try:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        def wait_shown(selector: str, missing: str) -> None:
            try:
                page.locator(selector).first.wait_for(timeout=START_TIMEOUT_S * 1000)
            except PlaywrightTimeout:
                pytest.fail(f"{edition}/{LESSON.name}: {missing} ({selector})")

        for what, selector in (("markdown rendered by jupyterlab-myst", ".jp-MarkdownCell .myst"),
                               ("the learning goals' admonition",  # React, or inside <div dir>
                                ".jp-MarkdownCell aside:is(.myst-admonition, .admonition)")):
            wait_shown(f"{PANEL} {selector}", f"no {what}")
        shown = page.evaluate(SHOWN_MARKDOWN)
        assert len(shown) == markdown_cells, f"saw {len(shown)} of {markdown_cells} markdown cells"
        raw = [(index, match.group()) for index, text in shown
               for match in RAW_MYST.finditer(text)]
        assert not raw, f"raw MyST shown in {edition}/{LESSON.name}: {raw[:5]}"
        page.evaluate(f"""() => document.querySelector("{PANEL} .jp-WindowedPanel-outer").scrollTop = 0""")
        # a JupyterLab that drops the cells out of view draws the first one again on a later frame
        wait_shown(f"{FIRST_MARKDOWN} .myst h1:visible",
                   "back at the top, the first cell shows no title")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"jupyterlab-{edition}-78-myst.png"))
        first = page.evaluate(FIRST_CELL)
        assert first["titles"] == [title], (
            f"the lesson's title should be shown once, but the first cell shows {first['titles']}")
        if edition == "fa":  # prose drawn as plain HTML inside the wrapper (jupyterlab-rtl.css)
            assert first["formulas"] and set(first["formulas"]) == {"ltr"}, (
                f"the first cell's formulas should read left to right: {first['formulas']}")
            assert first["admonition_bar"] not in ("", "0px"), (
                f"the learning goals' admonition should have a bar: {first}")
        assert not blocked, f"JupyterLab tried to reach other hosts: {blocked}"
    finally:
        page.close()


def test_the_raw_myst_check_finds_what_jupyterlab_showed_before() -> None:
    """What JupyterLab without jupyterlab-myst showed (a label line, an option, a fence,
    a role) is found; rendered prose with braces or colons is not."""
    for raw in ["(lesson-78-fa)=", ":class: tip", "```{admonition} goals", "see {doc}`/fa/glossary`"]:
        assert RAW_MYST.search(raw), raw
    for fine in ["نسبت: ۱۲ بایت", "a set {0, 1}", "ratio: 12 bytes", r"\\lceil \\Psi/N \\rceil"]:
        assert not RAW_MYST.search(fine), fine
