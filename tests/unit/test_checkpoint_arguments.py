"""Lesson 80's checkpoint functions refuse bad world sizes, ranks and counts before touching a file."""

import pytest

from lesson_code.checkpoint import save_sharded
from lesson_code.checkpoint.tools import prune_checkpoints, reshard

CASES = {
    "world size 0": (lambda root: save_sharded(root, {}, step=1, rank=0, world_size=0),
                     "world_size must be a positive int, got 0: pass the number of ranks that save"),
    "world size True": (lambda root: save_sharded(root, {}, step=1, rank=0, world_size=True),
                        "world_size must be a positive int, got True"),
    "rank outside": (lambda root: save_sharded(root, {}, step=1, rank=4, world_size=4),
                     r"rank must be an int in 0\.\.3, got 4: pass this process's rank"),
    "reshard to 0 ranks": (lambda root: reshard(root / "step-00000001", root / "out", 0),
                           "world_size must be a positive int, got 0: pass the number of ranks "
                           "that will load it"),
    "keep none": (lambda root: prune_checkpoints(root, 0),
                  "keep_last must be a positive int, got 0: pass 1 or more"),
    "keep 1.5": (lambda root: prune_checkpoints(root, 1.5), "keep_last must be a positive int"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_are_refused_with_the_value_and_the_fix(tmp_path, case):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing was written
