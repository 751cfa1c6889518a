"""The fork server the ranks start from follows its caller, run after run, in the same
(notebook-like) process: an edit to a package reaches the ranks of the next run, and so does
the caller's environment; the server is the course's own, beside any the caller's code starts.

The fork server imports the rank function's package once; a run after an edit must not fork
from a server that still holds the old code, nor wait for processes that are not the course's.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

from lesson_code import launch

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


WATCHED = ("LESSON_CODE_RESULTS", "LESSON_CODE_TEST_MARK", "OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")


def environment_seen(rank, world_size):
    return {"server": os.getppid(), "threads": torch.get_num_threads(),
            **{name: os.environ.get(name) for name in WATCHED}}


def test_the_ranks_of_each_run_see_their_callers_environment_of_that_moment(tmp_path,
                                                                            monkeypatch):
    """A notebook that changes a variable between two runs (GLOO_SOCKET_IFNAME, where results go)
    sees the ranks of the second run follow it, though both runs fork from the same server, which
    started with the environment of the first. What the course sets in every rank stays set."""
    monkeypatch.delenv("LESSON_CODE_TEST_MARK", raising=False)
    monkeypatch.delenv("LESSON_CODE_RESULTS", raising=False)
    first = launch.spawn(environment_seen, world_size=2)
    monkeypatch.setenv("LESSON_CODE_TEST_MARK", "set after the first run")
    monkeypatch.setenv("LESSON_CODE_RESULTS", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # the ranks keep one thread each regardless
    second = launch.spawn(environment_seen, world_size=2)
    monkeypatch.delenv("LESSON_CODE_TEST_MARK")
    third = launch.spawn(environment_seen, world_size=2)
    servers = {seen["server"] for seen in first + second + third}
    assert len(servers) == 1 and os.getpid() not in servers, "the runs did not share one server"
    course = {"threads": 1, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert all(seen["LESSON_CODE_TEST_MARK"] is None and seen["LESSON_CODE_RESULTS"] is None
               for seen in first)
    assert all(seen["LESSON_CODE_TEST_MARK"] == "set after the first run"
               and seen["LESSON_CODE_RESULTS"] == str(tmp_path) for seen in second), second
    assert all(seen["LESSON_CODE_TEST_MARK"] is None for seen in third), third
    assert all(seen.items() >= course.items() for seen in first + second + third)


SHARED_SCRIPT = textwrap.dedent('''
    import json, multiprocessing, sys, time
    from multiprocessing import forkserver
    sys.path.insert(0, sys.argv[1])
    from lesson_code import launch
    import shared_ranks

    # The caller's own processes: one from multiprocessing's fork server, started before any
    # run (a Pool's or a DataLoader's worker would be one), and one forked from the caller after
    # the first run, which holds copies of every descriptor the caller had then.
    theirs = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(600,))
    theirs.start()
    first = launch.spawn(shared_ranks.report, world_size=2)
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    forked.start()
    with open(shared_ranks.__file__, "w") as handle:
        handle.write(shared_ranks.EDITED)
    second = launch.spawn(shared_ranks.report, world_size=2)
    print(json.dumps({"first": first, "second": second,
                      "their server": forkserver._forkserver._forkserver_pid}))
    for process in (theirs, forked):
        process.kill()
        process.join()
''')
SHARED_RANKS = textwrap.dedent('''
    import os
    IMPORTED_IN = os.getpid()
    EDITED = open(__file__).read().replace('"original"', '"edited"')

    def report(rank, world_size):
        return {"version": "original", "server": os.getppid(),
                "preloaded": IMPORTED_IN != os.getpid(), "threads": os.environ["OMP_NUM_THREADS"]}
''')


def test_the_course_uses_a_fork_server_of_its_own_beside_the_callers_processes(tmp_path):
    """A caller whose own code uses multiprocessing's fork server (started first, its child
    still running) gets ranks from the course's server, with the course's imports and
    environment; and after an edit the next run restarts that server at once, though the
    caller's children live on, one of them holding copies of the caller's descriptors."""
    (tmp_path / "shared_ranks.py").write_text(SHARED_RANKS)
    caller = subprocess.Popen([sys.executable, "-c", SHARED_SCRIPT, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # its whole group is killed below
    try:
        out, err = caller.communicate(timeout=240)  # the caller's children sleep for 600 s
    except subprocess.TimeoutExpired:
        out, err = "", "the second run waited for the caller's own processes"
    finally:
        try:
            os.killpg(caller.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        caller.wait()
    assert caller.returncode == 0 and out, err[-3000:]
    seen = json.loads(out.splitlines()[-1])
    started_with = {"preloaded": True, "threads": "1"}
    for run, version in (("first", "original"), ("second", "edited")):
        assert all(rank.items() >= {**started_with, "version": version}.items()
                   and rank["server"] != seen["their server"] for rank in seen[run]), seen
    assert seen["first"][0]["server"] != seen["second"][0]["server"]  # restarted after the edit
