"""What the lessons' labs share to measure and check: timing on every rank at once, argument
checks with the fix in the message, command-line arguments, references computed in one rank, and
tables written whole or not at all.

    timing.py      phase clocks, the median of repeated collectives, this machine in one line
    validate.py    ValueError with the value and the fix (runtime.validate's), for anything
                   a reader passes in
    cli_args.py    the checks of the lessons' command lines (exit 2, one line)
    reference.py   single-process references run under a rank's conditions (one thread)
    files.py       `replacing(path)`: a table that a later run reads, replaced atomically
"""
