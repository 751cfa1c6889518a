"""The capstone (lesson 81): MiniGPT trained 20 steps on 4 ranks with DDP + ZeRO-1 + sharded
checkpoints after steps 10 and 20, composed in one place and checked end to end.

    python -m lesson_code.capstone                                  # 4 ranks, spawned here
    torchrun --standalone --nproc-per-node=4 --max-restarts=2 -m lesson_code.capstone  # torchrun

It prints a 20-row loss table, a 4-row memory profile and the checkpoint's manifest, then resumes
from the step-10 checkpoint, trains to step 20 and prints RESUME VERIFIED when every checkpoint
reloads byte for byte and the resumed run ends bitwise where the uninterrupted run ends; it writes
metrics.jsonl, loss.png and run.json to the output folder. Run again with the same --out-dir (by
hand, or by torchrun restarting a failed group), it continues the run from its newest checkpoint
that verifies (`capstone.resume`); `capstone.crash` kills a run part-way and measures that.
Nothing else in the package imports this one. Its data, the Markov-chain corpus (`make_corpus`,
`batch_for_step`), lives with every lesson's data in `lesson_code.data` and is importable from
here too.
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
