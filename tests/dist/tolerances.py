"""A bound on whole training runs that a wrong gradient breaks, for the distributed tests.

Elementwise bounds cannot cover every parameter. MiniGPT's attention key biases have a true
gradient of exactly zero, so Adam walks them on rounding noise, typically by about lr per step in
either direction, and two correct runs may end about 2 x lr x steps apart there: a bound that
large holds for any Adam run from the same start, right or wrong. A bf16 model rounds every
stored weight to 8 significant bits, so its elementwise differences are large too.

The relative distance ||params - reference|| / ||reference - start|| asks instead how far a run
ends from the reference, as a fraction of how far training moved the reference. A run with a
wrong gradient goes somewhere else, about as far as training goes: measured 1.3 to 1.5 for a
gradient applied one element off (tests/dist/wrong_variants.py), in float32 and bf16 alike.
Correct runs, measured on 4 ranks over 10 steps: float32 at most 1.3e-4 (the key biases' walk
included), bf16 at most 0.08 (bf16 sums of 4 ranks' gradients). The bounds leave a margin of
75x and 3x above those and sit 130x and 5x below a wrong gradient.

Neither bound sees a gradient of the wrong scale: Adam divides by the gradient's root mean square,
so a reduce-scatter that sums where it should average (gradients N times too large) moves the
capstone's 20 steps only 3.2e-4 (relative distance) and its losses 6.4e-6. The global gradient
norm of every step does see it: the capstone's differs from the one-process reference's by at
most 1.0e-7 relative (measured, float32, 4 ranks, 20 steps), and by N - 1 (or 1 - 1/N) under a
wrong scale, at least 0.5 for N >= 2. GRAD_NORM_RELATIVE sits 1000x above the first and 5000x
below the second.
"""

import torch

FLOAT32_RELATIVE = 1e-2
BFLOAT16_RELATIVE = 0.25
GRAD_NORM_RELATIVE = 1e-4


def relative_distance(params: torch.Tensor, reference: torch.Tensor, start: torch.Tensor) -> float:
    """||params - reference|| / ||reference - start|| for flat parameter vectors."""
    moved = (reference.double() - start.double()).norm()
    return ((params.double() - reference.double()).norm() / moved).item()
