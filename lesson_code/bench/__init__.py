"""Benchmarks that print figures (never tests that assert a time): `make bench`.

    python -m lesson_code.bench collectives      # lesson 76: ring primitives vs gloo built-ins
    python -m lesson_code.bench ddp              # lesson 77: naive, bucketed and torch DDP
    python -m lesson_code.bench zero             # lesson 78: DDP, ZeRO-1, naive ZeRO, torch ZeRO
    python -m lesson_code.bench pipeline         # lesson 79: the measured bubble against its formula
    python -m lesson_code.bench capstone         # lesson 81: the whole command vs a torch-only twin
    python -m lesson_code.bench launch           # the launcher: start, failure and timeout times
    python -m lesson_code.bench all              # every benchmark

Each benchmark prints a table and writes it as CSV under bench-results/ (or --out-dir).
"""
