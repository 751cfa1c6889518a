"""`python -m lesson_code.practice`: see lesson_code.practice.cli."""

from lesson_code.practice.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
