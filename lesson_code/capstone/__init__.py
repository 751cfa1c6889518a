"""The capstone (lesson 81): MiniGPT trained 20 steps on 4 ranks with DDP + ZeRO-1 + a sharded
checkpoint at step 10, composed in one place and checked end to end.

    python -m lesson_code.capstone                                  # 4 ranks, spawned here
    torchrun --standalone --nproc-per-node=4 -m lesson_code.capstone  # the same, under torchrun

It prints a 20-row loss table, a 4-row memory profile and the checkpoint's manifest, then resumes
from the step-10 checkpoint, trains to step 20 and prints RESUME VERIFIED when the checkpoint
reloads byte for byte and the resumed run ends bitwise where the uninterrupted run ends; it writes
metrics.jsonl and loss.png to the output folder. Nothing else in the package imports this one. Its data, the
Markov-chain corpus (`make_corpus`, `batch_for_step`), lives with every lesson's data in
`lesson_code.data` and is importable from here too.
"""

from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.train import run_rank, verify_resume
from lesson_code.data import batch_for_step, make_corpus
from lesson_code.models import GPTConfig, MiniGPT

__all__ = ["CapstoneConfig", "GPTConfig", "MiniGPT", "batch_for_step", "main", "make_corpus",
           "run_rank", "verify_resume"]


def main(argv: list[str] | None = None) -> int:
    """Run the capstone from the command line; exit status 0 only if every property held."""
    from lesson_code.capstone.cli import main as cli_main
    return cli_main(argv)
