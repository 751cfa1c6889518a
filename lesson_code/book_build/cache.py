"""Seed the book's execution cache from the notebooks' stored outputs (book infrastructure).

The book's Sphinx extension (lesson_code.book_build.pages) calls `seed` at the start of every build, so
`jupyter-book build book` needs no step before it. The book builds with execute_notebooks: cache
(myst-nb with jupyter-cache in _build/.jupyter_cache): a notebook runs only when its code is not
in the cache. On a fresh clone the cache is empty, but
the notebooks hold the outputs of their last run by `make notebooks`, which recorded the hash of the
code it ran in notebooks/run-times.csv (lesson_code.book_build.run_times). Every notebook whose code still has
that hash and whose cells ran in order goes into the cache as it is; a notebook edited since
then does not, so the build executes it. The book never shows outputs of code other than its own.
"""

from __future__ import annotations

from pathlib import Path

from lesson_code.book_build import run_times


def ran_in_order(path: Path) -> bool:
    """True when the code cells' execution counts are 1, 2, 3, ... (one top-to-bottom run)."""
    import nbformat

    cells = nbformat.read(str(path), nbformat.NO_CONVERT).cells
    counts = [cell.get("execution_count") for cell in cells if cell.cell_type == "code"]
    return counts == list(range(1, len(counts) + 1))


def seed(root: Path, cache_folder: Path) -> dict[str, str]:
    """Cache every notebook whose stored outputs match its code; notebook -> what was done.

    `root` is a folder holding notebooks/ and its run-times.csv (the repository root, or the
    book's source folder, whose notebooks/ is a link to the repository's).
    """
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_folder))
    done = {}
    for name, row in sorted(run_times.read(root / run_times.CSV).items()):
        path = root / "notebooks" / name
        if not path.is_file():
            done[name] = "listed in the CSV but missing"
        elif run_times.notebook_hash(path) != row["code_hash"]:
            done[name] = "code changed since its stored run: the build executes it"
        elif not ran_in_order(path):
            done[name] = "stored outputs are not one run in order: the build executes it"
        else:
            cache.cache_notebook_file(str(path), uri=str(path), overwrite=True,
                                      data={"execution_seconds": float(row["seconds"])})
            done[name] = f"stored outputs reused ({row['seconds']} s on {row['machine']})"
    return done

