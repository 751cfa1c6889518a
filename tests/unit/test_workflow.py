"""The workflow that builds, checks and publishes the book (.github/workflows/book.yml).

Linted here, offline, with two tools installed from wheels: check-jsonschema validates it against
GitHub's workflow schema (shipped inside the package), and zizmor's static analysis finds
unpinned actions, credentials left behind, injectable expressions and over-wide permissions.
Its commands are the README's, so that a reader can run by hand exactly what CI runs.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
BIN = Path(sys.executable).parent


def lint(path: Path) -> list[str]:
    """The complaints of both linters about the workflow at `path` (empty when it is clean)."""
    complaints = []
    for command in ([BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows"],
                    [BIN / "zizmor", "--offline", "--no-progress"]):
        done = subprocess.run([*map(str, command), str(path)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            complaints.append(f"{command[0].name} (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return complaints


def commands(workflow: dict) -> list[str]:
    """Every line of every `run:` step, in order."""
    return [line.strip() for job in workflow["jobs"].values() for step in job.get("steps", [])
            for line in step.get("run", "").splitlines() if line.strip()]


def readme_code() -> str:
    """The README's code blocks, joined."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return "\n".join(re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.DOTALL))


def test_the_workflow_passes_both_linters():
    assert not lint(WORKFLOW), "\n".join(lint(WORKFLOW))


def test_the_workflow_runs_the_readme_commands():
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    readme = readme_code()
    missing = [command for command in commands(workflow) if command not in readme]
    assert not missing, f"commands of {WORKFLOW.name} that the README does not show: {missing}"


def test_the_workflow_builds_checks_and_publishes_the_html():
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    build, publish = workflow["jobs"]["build"], workflow["jobs"]["publish"]
    run = commands(workflow)
    assert any(c.endswith("jupyter-book build book -W -n --keep-going") for c in run)
    assert any(c.endswith("pytest --nbval notebooks/") for c in run)
    assert any(c.endswith("pytest tests/book/test_browser.py") for c in run)
    assert any("-c requirements.lock" in c for c in run)
    upload = next(s for s in build["steps"] if "upload-pages-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "_build/html"
    assert publish["needs"] == "build" and "refs/heads/main" in publish["if"]
    assert any("deploy-pages" in s.get("uses", "") for s in publish["steps"])


@pytest.mark.parametrize("damage, linter", [
    (("runs-on: ubuntu-latest\n    container", "runs_on: ubuntu-latest\n    container"),
     "check-jsonschema"),
    ((re.compile(r"actions/checkout@[0-9a-f]{40}  # v[\d.]+"), "actions/checkout@v7"), "zizmor"),
])
def test_the_linters_catch_a_broken_workflow(tmp_path, damage, linter):
    old, new = damage
    text = WORKFLOW.read_text(encoding="utf-8")
    broken = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new, 1)
    assert broken != text
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    path = tmp_path / ".github" / "workflows" / "book.yml"
    path.write_text(broken, encoding="utf-8")
    complaints = lint(path)
    assert any(complaint.startswith(linter) for complaint in complaints), complaints
