"""launch.spawn when its caller or its code changes under it: a killed caller, an edited package,
output that must reach the caller, and scripts the ranks cannot import. Real processes throughout.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from lesson_code import launch

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


# --- rank functions (module level, so spawned ranks can import them) -------------------------

def block_forever(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 0:
        time.sleep(3600)
    dist.barrier()  # the others wait in a collective for rank 0, as in a real hang
    return rank


def print_then_fail(rank, world_size):
    print(f"rank {rank} computed 42 on stdout")
    print(f"rank {rank} warns on stderr", file=sys.stderr)
    if rank == 1:
        raise ValueError("rank one fails after printing")
    dist.barrier()
    return rank


def print_then_abort(rank, world_size):
    print("about to abort", file=sys.stderr, flush=True)
    if rank == 1:
        os.abort()
    dist.barrier()
    return rank


def print_then_exit(rank, world_size):
    print(f"rank {rank} ran its function", flush=True)
    if rank == 1:
        os._exit(3)  # ends the process without an exception, as C code calling exit() would
    dist.barrier()
    return rank


def print_and_return(rank, world_size):
    print(f"hello from rank {rank}")
    return rank


# --- helpers --------------------------------------------------------------------------------

def run_python(code, cwd, timeout=120, stdin=None):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    command = [sys.executable, "-"] if stdin else [sys.executable, "-c", code]
    return subprocess.run(command, input=stdin, cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout)


def written_pids(folder):
    """The pids the ranks have finished writing into `folder` (a file may still be empty)."""
    texts = [path.read_text().strip() for path in folder.iterdir()]
    return [int(text) for text in texts if text]


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_ranks_exit_within_seconds_when_their_caller_is_killed(tmp_path, how):
    """Nothing of the run outlives its caller, however it is killed (SIGKILL as when a notebook
    kernel is killed, SIGTERM as by `kill <pid>`): no rank, no helper process, and neither the
    folder of the run's store and output files nor the fork server's socket, which the caller
    can no longer remove. The caller's TMPDIR is longer than a socket's path may be (a test
    runner's folders are): the server's socket goes elsewhere, and is removed all the same."""
    pids, temporary = tmp_path / "pids", tmp_path / ("long-temporary-folder-" * 4)
    pids.mkdir()
    temporary.mkdir()
    code = textwrap.dedent(f"""
        from lesson_code import launch
        import test_launch_faults as t
        launch.spawn(t.block_forever, {str(pids)!r}, world_size=2, timeout_s=600)
    """)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]),
                       TMPDIR=str(temporary))
    errors = tmp_path / "caller.err"
    with errors.open("w") as stderr:
        caller = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=environment,
                                  stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while len(written_pids(pids)) < 2 and time.monotonic() < deadline \
                and caller.poll() is None:
            time.sleep(0.2)
        ranks = written_pids(pids)
        assert len(ranks) == 2, f"the ranks did not start: {errors.read_text()[-2000:]}"
        assert list(temporary.glob("lesson_code_store_*")), "the run's folder is elsewhere"
        helpers = [c.pid for c in psutil.Process(caller.pid).children(recursive=True)]
        sockets = [connection.laddr for pid in helpers if alive(pid)
                   for connection in psutil.Process(pid).net_connections(kind="unix")
                   if os.path.basename(connection.laddr).startswith("listener-")]
        assert sockets, "the fork server listens on no socket"
        caller.send_signal(getattr(signal, how))
        caller.wait(10)
        killed_at = time.monotonic()
        def left():  # multiprocessing's folder (pymp-) holds the fork server's socket
            return [path.name for path in temporary.iterdir()
                    if path.name.startswith(("lesson_code_store_", "pymp-"))]
        while (any(alive(pid) for pid in ranks + helpers) or left()) \
                and time.monotonic() - killed_at < 10:
            time.sleep(0.1)
        survivors = [pid for pid in ranks + helpers if alive(pid)]
        assert not survivors, f"processes outlived their killed caller by 10 s: {survivors}"
        assert not left(), f"files of the run outlived their killed caller by 10 s: {left()}"
        kept = [path for path in sockets if os.path.exists(os.path.dirname(path))]
        assert not kept, f"the fork server's socket folder outlived its killed caller: {kept}"
    finally:
        caller.kill()
        for pid in written_pids(pids):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_code_edited_after_a_first_run_reaches_the_ranks_of_the_next(tmp_path):
    package = tmp_path / "editedpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "work.py").write_text("def answer(rank, world_size):\n    return 1\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from pathlib import Path
        from lesson_code import launch
        from editedpkg import work
        print("first", launch.spawn(work.answer, world_size=1, timeout_s=60))
        source = Path(work.__file__)
        source.write_text(source.read_text().replace("return 1", "return 22"))
        print("second", launch.spawn(work.answer, world_size=1, timeout_s=60))
    """)
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "first [1]" in completed.stdout and "second [22]" in completed.stdout, completed.stdout


def test_a_failing_rank_brings_what_it_printed_with_its_error(capsys):
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(print_then_fail, world_size=2, timeout_s=60)
    error = caught.value
    assert "rank one fails after printing" in error.rank_traceback
    assert "rank 1 computed 42 on stdout" in error.output
    assert "rank 1 warns on stderr" in error.output
    assert "last output of rank 1" in str(error) and "rank 1 warns on stderr" in str(error)


def test_a_crashed_rank_brings_what_it_printed_with_its_error():
    with pytest.raises(launch.RankCrashedError) as caught:
        launch.spawn(print_then_abort, world_size=2, timeout_s=60)
    assert caught.value.rank == 1 and "about to abort" in str(caught.value)


def test_a_rank_that_exits_in_its_function_is_not_said_never_to_have_started_it():
    with pytest.raises(launch.RankCrashedError) as caught:
        launch.spawn(print_then_exit, world_size=2, timeout_s=60)
    error = caught.value
    assert error.rank == 1 and error.exitcode == 3 and error.started
    assert "while running its function" in str(error) and "os._exit" in str(error)
    assert "did not start" not in str(error) and "rank 1 ran its function" in str(error)


def test_a_rank_that_never_reaches_its_function_is_told_why(tmp_path):
    """A script that spawns at its top level: each rank re-runs it while starting, and the
    spawn it reaches there fails before the rank's function could run."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""
        from lesson_code import launch
        import test_launch_faults
        try:
            launch.spawn(test_launch_faults.print_and_return, world_size=2, timeout_s=60)
        except launch.RankCrashedError as error:
            print("started:", error.started, "|", str(error).splitlines()[0])
    """))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    completed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment,
                               capture_output=True, text=True, timeout=120)
    assert "started: False |" in completed.stdout, completed.stdout + completed.stderr[-2000:]
    assert "did not start the rank function" in completed.stdout
    assert "if __name__ == '__main__':" in completed.stdout


def test_a_successful_run_shows_what_the_ranks_printed(capsys):
    assert launch.spawn(print_and_return, world_size=2, timeout_s=60) == [0, 1]
    printed = capsys.readouterr().out
    assert "hello from rank 0" in printed and "hello from rank 1" in printed


def test_a_rank_that_fails_to_start_leaves_no_pipe_open(tmp_path):
    """Out of file descriptors (a notebook that leaked many), a rank's process.start() raises:
    the ends of that rank's result pipe are closed by then, not left open for as long as
    something holds the error, as a notebook holds the last one. Each limit on open files is
    tried, from the files open now up, until a run starts. Once it has, the caller holds the
    files it held before (multiprocessing's own request for a process, out of files midway,
    leaves a pipe open) and the fork server is the one it had (a request cut short ends it)."""
    code = textwrap.dedent("""
        import gc, os, resource, traceback
        from lesson_code import launch
        from lesson_code.runtime import fork_server
        import test_launch_faults as t

        def open_files():
            return set(os.listdir("/dev/fd"))

        launch.spawn(t.print_and_return, world_size=2)  # the fork server runs
        server, before = fork_server.SERVER._forkserver_pid, open_files()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        for limit in range(len(open_files()), len(open_files()) + 60):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            try:
                launch.spawn(t.print_and_return, world_size=2, timeout_s=60)
                error = None
            except OSError as caught:
                error = caught  # kept, as a notebook keeps the last error
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            if error is None:
                break
            held = open_files()
            in_start = "start" in [frame.name for frame in traceback.extract_tb(error.__traceback__)]
            del error
            gc.collect()
            print(limit, in_start, sorted(held - open_files()))
        print("left open:", sorted(open_files() - before))
        print("same server:", fork_server.SERVER._forkserver_pid == server)
    """)
    completed = run_python(code, tmp_path, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    tried = [line.split(" ", 2) for line in completed.stdout.splitlines() if line[:1].isdigit()]
    assert any(in_start == "True" for _, in_start, _ in tried), completed.stdout
    held_by_the_error = [(limit, files) for limit, _, files in tried if files != "[]"]
    assert not held_by_the_error, held_by_the_error
    assert "left open: []" in completed.stdout, completed.stdout[-2000:]
    assert "same server: True" in completed.stdout, completed.stdout[-2000:] + completed.stderr[-2000:]


@pytest.mark.parametrize("function", ["work", "test_launch_faults.print_and_return"])
def test_a_script_read_from_standard_input_is_told_how_to_run(tmp_path, function):
    # Even a function from a module fails there: every rank re-runs the caller's script.
    script = textwrap.dedent(f"""
        from lesson_code import launch
        import test_launch_faults
        def work(rank, world_size):
            return rank
        if __name__ == "__main__":
            launch.spawn({function}, world_size=2, timeout_s=30)
    """)
    completed = run_python(None, tmp_path, stdin=script)
    assert completed.returncode != 0
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError") and "standard input" in last, completed.stderr[-2000:]
    assert "python that_file.py" in last
