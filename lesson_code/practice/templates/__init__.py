"""The learner's starting files, one per lesson and language, and the function that writes one.

A template `NN.LANG.py.tmpl` holds the course's signatures with docstrings in that language and
bodies that raise NotImplementedError; `{path}` in it becomes the path written, so the check
command it quotes can be copied as is.
"""

from __future__ import annotations

from pathlib import Path

from lesson_code.practice.messages import check_language

FOLDER = Path(__file__).resolve().parent


def template_path(lesson: int, lang: str) -> Path:
    """The template file of `lesson` in `lang` (FileNotFoundError when the lesson has none)."""
    path = FOLDER / f"{lesson}.{check_language(lang)}.py.tmpl"
    if not path.is_file():
        raise FileNotFoundError(f"no template for lesson {lesson} in {lang!r}")
    return path


def write_template(lesson: int, lang: str, destination: Path, overwrite: bool = False) -> Path:
    """Write lesson `lesson`'s template in `lang` to `destination`; return the path written.

    Refuses (FileExistsError) to replace an existing file unless `overwrite`: it may hold the
    learner's work.
    """
    if destination.exists() and not overwrite:
        raise FileExistsError(f"{destination} exists: choose another name with --out, or pass "
                              "--force to replace it")
    text = template_path(lesson, lang).read_text(encoding="utf-8")
    destination.write_text(text.replace("{path}", str(destination)), encoding="utf-8")
    return destination
