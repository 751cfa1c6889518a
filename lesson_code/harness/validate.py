"""The argument checks that the lessons' modules share: those of `lesson_code.runtime.validate`.

They are written there, under the launcher, which checks its own arguments with them; the
lessons' labs import them from here, beside the rest of what they share.

    require_positive_int("world_size", world_size, "the number of ranks, such as 4")
"""

from lesson_code.runtime.validate import require_choice, require_positive, require_positive_int

__all__ = ["require_choice", "require_positive", "require_positive_int"]
