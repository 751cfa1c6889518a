"""Run the book's offline scripts outside the browser, to compare what they compute with lesson_code.

`evaluate(scripts, expression, argument)` loads the scripts of book/static in order and returns
`expression` (a JavaScript function of one JSON argument) applied to `argument`, as JSON: under
node when it is installed, else in headless Chromium (a blank page, nothing fetched).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "book" / "static"
CHROMIUM = Path("/usr/bin/chromium-headless-shell")


def evaluate(scripts: list[str], expression: str, argument: object = None) -> object:
    """`expression`(argument) after loading `scripts` (names in book/static), as a JSON value."""
    sources = [(STATIC / name).read_text(encoding="utf-8") for name in scripts]
    if shutil.which("node"):
        program = "\n".join(sources) + \
            f"\nconsole.log(JSON.stringify(({expression})({json.dumps(argument)})));"
        done = subprocess.run(["node", "-e", program], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)
    if not CHROMIUM.exists():
        pytest.skip("neither node nor chromium-headless-shell is installed to run the scripts")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page()
        for source in sources:
            page.add_script_tag(content=source)
        result = page.evaluate(expression, argument)
        browser.close()
    return result
