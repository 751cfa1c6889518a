"""lesson_code: the code of lessons 76-81 of the distributed-training course book.

One module per lesson (collectives, ddp, zero, pipeline, checkpoint, capstone) plus the launcher
(launch), shared models, memory arithmetic and plotting. Import the module you need, for example
`from lesson_code import launch, collectives`; nothing heavy is imported here, because every rank
process imports this package.
"""

__version__ = "0.1.0"
