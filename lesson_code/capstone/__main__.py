"""`python -m lesson_code.capstone`: lesson 81's capstone run; see lesson_code.capstone.cli."""

from lesson_code.capstone.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
