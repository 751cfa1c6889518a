"""What a Persian line of practice mode may hold: Persian words, Persian digits, and code.

`foreign_words(line)` lists what a Persian reader should not meet in a sentence: English words
and numbers in Latin digits outside code. Code is what a learner would type or read in their
file: anything in backticks or quotes, a Python value with strings in it, a call with its
arguments (`dist.recv(recv, left)`), a dotted or underscored name (`torch.float32`,
`ring_all_reduce`), `name=value`, a flag (`--timeout`), a name with digits (`float32`, `ZeRO-1`,
`N-1`), a class-like name (`MiniGPT`, `DDP`), a single-letter symbol of a formula (`N`, `r`), and
the few lowercase names of libraries, keywords and constants in ALLOWED (a file is
`import`ed: Persian has no other word for it that is not already the loading of a checkpoint). A word such as "ring", "one" or "reduce-scatter", or a bare "1001",
is not code: in a Persian sentence it is an untranslated fragment.

`glossary_terms(path)` reads book/fa/glossary.md into {English term: Persian term}.
"""

from __future__ import annotations

import re
from pathlib import Path

PERSIAN_LETTER = re.compile(r"[\u0600-\u06FF]")
ALLOWED = {"torch", "gloo", "dist", "nn", "Adam", "True", "False", "None", "import"}
CODE_CHARACTERS = set("_.()[]='\"/<>*+|{}")
# A name in backticks, as written or as a report prints it: isolated left to right (U+2066..U+2069).
QUOTED = re.compile(r"`[^`]*`|\u2066[^\u2069]*\u2069|'[^'\s][^']*'|\"[^\"]*\"")
# A Python value with strings in it: [('F', 0), ('B', 0)], {'rank': 0}, ('F', i)
LITERAL = re.compile(r"\[[^\[\]]*['\"][^\[\]]*\]|\{[^{}]*['\"][^{}]*\}|\([^()]*['\"][^()]*\)")
# A call with its arguments (two levels of parentheses), e.g. torch.tensor_split(x.view(-1), N)[r]
CALL = re.compile(r"[A-Za-z_][\w.]*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)(?:\[[^\]]*\])?")
SUBSCRIPT = re.compile(r"[A-Za-z_][\w.]*\[[^\]]*\]")  # result["checkpoints"], sizes[r]
NAME_TUPLE = re.compile(r"\(\s*[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+\s*\)")
LATIN_RUN = re.compile(r"[!-~]+")
EDGE_PUNCTUATION = "()[],:;.!?"


def is_persian(line: str) -> bool:
    return bool(PERSIAN_LETTER.search(line))


def foreign_words(line: str) -> list[str]:
    """The English words and Latin-digit numbers of `line` that are not code (see the module)."""
    line = line.replace('"""', " ")  # a docstring's quotes open no string of the sentence
    for pattern in (CALL, SUBSCRIPT, LITERAL, QUOTED, NAME_TUPLE):
        line = pattern.sub(" ", line)
    found = []
    for run in LATIN_RUN.findall(line):
        word = run.strip(EDGE_PUNCTUATION)
        if word and not _is_code(word):
            found.append(word)
    return found


def _is_code(word: str) -> bool:
    letters = re.findall(r"[A-Za-z]+", word)
    digits = re.search(r"[0-9]", word)
    if not letters:
        return not digits  # a Latin number is not code; lone punctuation (-, %, ×) is no word
    if word.startswith("--") or CODE_CHARACTERS & set(word) or digits:
        return True
    if all(len(part) == 1 for part in letters) and word not in ("a", "A", "I"):
        return True  # a formula's symbols: N, r, N-s
    if any(part[1:] != part[1:].lower() for part in letters):
        return True  # MiniGPT, DDP, NotImplementedError
    return word in ALLOWED


def glossary_terms(path: Path) -> dict[str, str]:
    """{English term: Persian term} of the glossary's entries (each English in backticks)."""
    terms: dict[str, str] = {}
    headwords: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith((" ", "`", "(", "#", "{")) and is_persian(line):
            headwords.append(line.strip())
        elif line.strip().startswith("انگلیسی:") and headwords:
            for english in re.findall(r"`([^`]+)`", line):
                terms[english] = headwords[0]
            headwords = []
        elif not line.strip():
            headwords = []
    return terms
