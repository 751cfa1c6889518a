"""The book's build: the Sphinx extension of the two editions, and the notebooks' stored runs.

    pages.py       the Sphinx extension (_config.yml loads it): editions, switch, run box
    cache.py       puts the stored outputs of unchanged notebooks into the execution cache
    run_times.py   `make notebooks`: runs every notebook, records its time and code hash
    listings.py    the code each lesson shows, stored in its notebook and kept equal to the package

Not a lesson: nothing here runs ranks.
"""
