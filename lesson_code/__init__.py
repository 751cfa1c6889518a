"""lesson_code: the code of lessons 76-81 of the distributed-training course book.

Each lesson's algorithm is one module or one small package (collectives/, ddp, zero, pipeline,
checkpoint/, capstone/), and beside it a `*_lab` module holds what the lesson runs: rank
functions, single-process references, demos and its command line (`python -m
lesson_code.zero_lab`). What every lab shares is in `experiment`; `launch` starts the ranks.
Import the module you need, for example `from lesson_code import launch, collectives`; nothing
heavy is imported here, because every rank process imports this package.
"""

__version__ = "0.1.0"
