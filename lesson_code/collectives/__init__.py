"""Lesson 76: collective primitives built from point-to-point messages.

    ring.py        ring all-reduce, reduce-scatter, all-gather, tree broadcast, naive all-reduce
    doubling.py    recursive doubling and halving-doubling all-reduce (few steps, any N)
    direct.py      direct reduce-scatter, all-gather, all-reduce (the ring's bytes, one round)
    naive.py       reduce-scatter and all-gather through rank 0 (one wake-up per other rank)
    shared_memory.py  all-reduce through a shared segment, for ranks on one machine (no bytes sent)
    choose.py      `all_reduce`, `reduce_scatter`, `all_gather` with algorithm="auto": the
                   fastest algorithm for the size
    p2p.py         `Peers`: bounded isend/irecv between ranks (the only place messages are sent)
    ledger.py      `CommLedger`: calls, messages and bytes each rank sends
    comm.py        `Communicator`: one switch between these rings and torch.distributed's own
    cost_model.py  the alpha-beta model: predicted time, messages and bytes per algorithm

What the lesson runs with them (checks against torch.distributed, timings, ledgers) is in
`lesson_code.collectives_lab`; `python -m lesson_code.collectives_lab` runs the checks.

    from lesson_code import collectives
    collectives.ring_all_reduce(tensor, "sum")      # call on every rank
    collectives.all_reduce(tensor, "sum")           # the algorithm chosen by size
    collectives.reduce_scatter(tensor, "sum")       # ring, direct or naive, chosen by size
"""

from lesson_code.collectives.choose import all_gather, all_reduce, reduce_scatter
from lesson_code.collectives.direct import (direct_all_gather, direct_all_reduce,
                                            direct_reduce_scatter)
from lesson_code.collectives.doubling import (halving_doubling_all_reduce,
                                              recursive_doubling_all_reduce)
from lesson_code.collectives.naive import naive_all_gather, naive_reduce_scatter
from lesson_code.collectives.shared_memory import shared_memory_all_reduce
from lesson_code.collectives.ring import (OPS, broadcast, naive_all_reduce, ring_all_gather,
                                          ring_all_reduce, ring_chunk_indices, ring_reduce_scatter)

__all__ = ["OPS", "all_gather", "all_reduce", "broadcast", "direct_all_gather",
           "direct_all_reduce", "direct_reduce_scatter", "halving_doubling_all_reduce",
           "naive_all_gather", "naive_all_reduce", "naive_reduce_scatter",
           "recursive_doubling_all_reduce", "reduce_scatter", "shared_memory_all_reduce",
           "ring_all_gather", "ring_all_reduce", "ring_chunk_indices", "ring_reduce_scatter"]
