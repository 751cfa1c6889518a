"""Practice mode: the learner writes each lesson's piece, and the course grades it on real ranks.

    python -m lesson_code.practice start 78 --lang fa        # writes my_zero.py, a template
    python -m lesson_code.practice check 78 my_zero.py --lang fa
    python -m lesson_code.practice check 78 my_zero.py --lang fa --only 3    # check 3 again

`start` writes a template (the course's signatures, docstrings in the chosen language, bodies that
raise NotImplementedError). `check` imports the learner's file in every rank of real gloo process
groups and applies the checks the course applies to its own implementation (world sizes, groups,
awkward lengths, dtypes, bytes on the wire, equality with PyTorch within the course's tolerances,
fault cases), then prints a table of checks in the chosen language. A function that hangs is
reported once, within `--timeout`, with where each rank waited; checks that would call it again
are not run. Exit status 0 only when all pass.

Modules: `grading` (checks, failures, runs of ranks), `rank_checks` (what a grading rank does),
`hangs` (where and why ranks hung), `callgraph` (which learner functions a check reaches),
`messages` (the report's words in both languages), `report` (the table), `timing` (the learner's
code against the course's), `templates` (writing a template), `lessons` (one module per lesson),
`cli` (the command line).
"""
