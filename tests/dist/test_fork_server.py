"""An edit to a package reaches the ranks of the next run, in the same (notebook-like) process.

The fork server imports the rank function's package once; a run after an edit must not fork
from a server that still holds the old code.
"""

import os
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from lesson_code import launch
    import edited_package.ranks as ranks

    first = launch.spawn(ranks.version, world_size=2)
    path = os.path.join(sys.argv[1], "edited_package", "ranks.py")
    time.sleep(0.05)  # a later modification time, even on coarse clocks
    with open(path, "w") as handle:
        handle.write("def version(rank, world_size):\\n    return 'edited'\\n")
    second = launch.spawn(ranks.version, world_size=2)
    print(first, second)
''')


def test_an_edited_package_reaches_the_next_run(tmp_path):
    package = tmp_path / "edited_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ranks.py").write_text("def version(rank, world_size):\n    return 'original'\n")
    old = time.time() - 60  # so that the edit below is surely newer
    os.utime(package / "ranks.py", (old, old))
    # On the path of every process, the fork server's included, as a reader's own package is.
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    completed = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                               text=True, timeout=300, env=environment)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split("\n")[-2] == "['original', 'original'] ['edited', 'edited']", \
        completed.stdout


PRELOAD_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, sys.argv[1])  # the rank function's folder: on the caller's path only
    from lesson_code import launch, plots, zero_lab
    import preloaded_ranks

    print(launch.spawn(preloaded_ranks.what_the_rank_started_with, world_size=2))
''')
RANK_MODULE = textwrap.dedent('''
    import os, sys
    IMPORTED_IN = os.getpid()

    def what_the_rank_started_with(rank, world_size):
        return {"own module from the server": IMPORTED_IN != os.getpid(),
                "zero_lab": "lesson_code.zero_lab" in sys.modules,
                "plots": "lesson_code.plots" in sys.modules,
                "matplotlib": "matplotlib" in sys.modules}
''')


def test_a_rank_starts_with_the_course_modules_its_caller_imported(tmp_path):
    """The fork server imports, once, the lesson_code modules the caller has imported (their
    ranks would each import them again) and the rank function's module, found on the caller's
    sys.path; not the modules that draw, which no rank uses."""
    (tmp_path / "preloaded_ranks.py").write_text(RANK_MODULE)
    completed = subprocess.run([sys.executable, "-c", PRELOAD_SCRIPT, str(tmp_path)],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    started_with = {"own module from the server": True, "zero_lab": True, "plots": False,
                    "matplotlib": False}
    assert completed.stdout.split("\n")[-2] == str([started_with] * 2), completed.stdout


BROKEN_SCRIPT = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from lesson_code import launch
    from lesson_code.runtime.errors import RankFailedError
    import edited_ranks, other_ranks

    print(launch.spawn(edited_ranks.value, world_size=2))
    with open(edited_ranks.__file__, "w") as handle:  # an edit that breaks the module
        handle.write("raise RuntimeError('broken by the edit')\\n")
    try:
        launch.spawn(edited_ranks.value, world_size=2)
    except RankFailedError as error:
        print("reported by the rank:", "broken by the edit" in str(error))
    print(launch.spawn(other_ranks.handed_over, world_size=2))
    print("caller:", [os.environ.get(name) for name in ("LESSON_CODE_SERVER_SYS_PATH",
                                                        "LESSON_CODE_SERVER_MODULES")])
''')


def test_a_module_broken_by_an_edit_fails_its_own_run_and_not_the_server(tmp_path):
    """The server skips a module that fails to import (multiprocessing would stop it, and every
    later run): the rank that imports the module reports the error, and other runs go on; what
    the caller handed the server is in neither the ranks' environment nor the caller's after."""
    (tmp_path / "edited_ranks.py").write_text("def value(rank, world_size):\n    return rank\n")
    (tmp_path / "other_ranks.py").write_text(textwrap.dedent('''
        import os
        def handed_over(rank, world_size):
            return [os.environ.get(name) for name in ("LESSON_CODE_SERVER_SYS_PATH",
                                                      "LESSON_CODE_SERVER_MODULES")]
    '''))
    completed = subprocess.run([sys.executable, "-c", BROKEN_SCRIPT, str(tmp_path)],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[-4:] == [
        "[0, 1]", "reported by the rank: True", "[[None, None], [None, None]]",
        "caller: [None, None]"], completed.stdout
