"""Lesson commands under torchrun on several nodes: the same command, the same numbers.

Two torchrun agents on this machine act as two nodes of 2 processes each. They meet through
c10d rendezvous on 127.0.0.1 and share one output folder, as cluster nodes share a filesystem.
torchrun decides which agent becomes node 0, so the report (printed by global rank 0 only) may
come from either agent: both outputs are read. Every agent runs under a deadline, and each agent
and each worker it started (torchrun gives workers sessions of their own) is killed in a
`finally`, so a failing run leaves no process behind.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from lesson_code import launch
from lesson_code.capstone.crash import same_tensors
from lesson_code.collectives.choose import RESULTS_VARIABLE

from own_tables import write_ring_fastest

ROOT = Path(__file__).resolve().parents[2]
NODES, PROCESSES_PER_NODE = 2, 2
AGENT_TIMEOUT_S = 120.0
# More threads than torchrun's default: init_from_env must still bring every worker to one
# thread, the count the spawned ranks use, or float sums could differ from the spawned run.
ENVIRONMENT = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="2")


def free_port() -> int:
    """A TCP port no one listens on now (the kernel's pick for port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_nodes(module_args: list[str], logs: Path,
                  node_environments: list[dict[str, str]] | None = None,
                  max_restarts: int = 0) -> list[tuple[int, str, str]]:
    """Run `python -m <module_args>` on 2 torchrun agents; return (exit code, stdout, stderr) each.

    `module_args` may instead start with a script's path (a .py file). `node_environments` adds
    variables to one agent's environment each, as two nodes' own settings would. Each agent
    restarts the group after a failure at most `max_restarts` times.
    Raises AssertionError, after killing everything, when an agent outlives AGENT_TIMEOUT_S.
    """
    port, run_id = free_port(), f"lesson-{uuid.uuid4().hex[:12]}"
    target = module_args if module_args[0].endswith(".py") else ["-m", *module_args]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
               f"--nproc-per-node={PROCESSES_PER_NODE}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
               "--rdzv-conf=join_timeout=60", f"--max-restarts={max_restarts}", *target]
    logs.mkdir(parents=True, exist_ok=True)
    agents, files = [], []
    try:
        for node in range(NODES):
            out, err = open(logs / f"agent{node}.out", "w"), open(logs / f"agent{node}.err", "w")
            files += [out, err]
            environment = {**ENVIRONMENT, **(node_environments or [{}] * NODES)[node]}
            agents.append(subprocess.Popen(command, cwd=ROOT, env=environment, stdout=out,
                                           stderr=err, start_new_session=True))
        deadline = time.monotonic() + AGENT_TIMEOUT_S
        for node, agent in enumerate(agents):
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"agent {node} still running after {AGENT_TIMEOUT_S} s:\n"
                                     + _tails(logs)) from None
    finally:
        _kill_agents(agents)
        for file in files:
            file.close()
    return [(agent.returncode, (logs / f"agent{node}.out").read_text(),
             (logs / f"agent{node}.err").read_text()) for node, agent in enumerate(agents)]


def _kill_agents(agents: list[subprocess.Popen]) -> None:
    """SIGKILL every agent's process group and every worker's (each worker leads its own)."""
    groups = set()
    for agent in agents:
        groups.add(agent.pid)  # start_new_session: the agent leads its process group
        try:
            children = psutil.Process(agent.pid).children(recursive=True)
        except psutil.Error:
            children = []  # the agent has exited, and torchrun stopped its workers first
        for child in children:
            try:
                groups.add(os.getpgid(child.pid))
            except ProcessLookupError:
                pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for agent in agents:
        agent.wait(timeout=10)


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}" for path in sorted(logs.iterdir()))


def reports(results: list[tuple[int, str, str]], marker: str) -> list[str]:
    """The agents' stdouts that hold `marker`, after checking that every agent exited with 0."""
    for node, (code, out, err) in enumerate(results):
        assert code == 0, f"agent {node} exited with {code}:\n{out[-2000:]}\n{err[-3000:]}"
    return [out for _, out, _ in results if marker in out]


def printed_losses(report: str) -> list[tuple[int, str]]:
    """(step, loss as printed) for every row of the capstone's loss table."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "loss"]) + 1
    rows = []
    for line in lines[start:]:
        fields = line.split()
        if len(fields) != 5 or not fields[0].isdigit():
            break
        rows.append((int(fields[0]), fields[1]))
    return rows


def metric_losses(out_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_capstone_on_two_nodes_survives_a_rank_killed_in_a_save_and_ends_as_the_spawned_run(tmp_path):
    # Rank 3 (on either node) dies half-way through writing its shard of the step-10 checkpoint.
    # Both agents restart their workers; the run continues from step 5, the checkpoint before
    # the broken save, and ends with the 20 losses and the last checkpoint of 4 spawned ranks.
    # Over several nodes a restart needs a store of its own (see launch.attempt_prefix).
    nodes_dir, spawned_dir = tmp_path / "nodes", tmp_path / "spawned"
    own_stores = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    results = run_two_nodes(["lesson_code.capstone", "--out-dir", str(nodes_dir), "--checkpoint-step",
                             "5", "--checkpoint-every", "5", "--kill-at-step", "10",
                             "--kill-during-save"], tmp_path / "logs", [own_stores] * NODES,
                            max_restarts=2)
    spawned = subprocess.run([sys.executable, "-m", "lesson_code.capstone", "--out-dir",
                              str(spawned_dir)], cwd=ROOT, env=ENVIRONMENT, capture_output=True,
                             text=True, timeout=AGENT_TIMEOUT_S)
    assert spawned.returncode == 0, spawned.stdout[-2000:] + spawned.stderr[-2000:]
    found = reports(results, "lesson 81 capstone")
    assert len(found) == 1, "exactly one process (global rank 0) prints the report"
    report = found[0]
    assert "on 4 ranks" in report and "on 4 ranks" in spawned.stdout
    started = report.splitlines()[1:3]
    assert started[0].startswith(f"resumed from step 5: {nodes_dir}/checkpoints/step-00000005")
    assert "torchrun has restarted the ranks 1 time(s)" in started[0]
    assert started[1] == "  skipped .step-00000010.tmp: an interrupted save, never published"
    assert report.rstrip().splitlines()[-1].startswith("RESUME VERIFIED: this run, continued from the step-5")
    assert spawned.stdout.rstrip().splitlines()[-1].startswith("RESUME VERIFIED: a run resumed from the step-10")
    losses = printed_losses(report)
    assert [step for step, _ in losses] == list(range(1, 21))
    assert losses == printed_losses(spawned.stdout)
    assert metric_losses(nodes_dir) == metric_losses(spawned_dir)  # every bit, not 5 decimals
    last = [folder / "checkpoints" / "step-00000020" for folder in (nodes_dir, spawned_dir)]
    assert same_tensors(*last, world_size=4)
    shards = sorted(p.name for p in last[0].glob("shard-*"))
    assert shards == [f"shard-{r:05d}-of-00004.pt" for r in range(4)]


def test_a_lesson_that_joins_the_group_twice_runs_on_two_nodes(tmp_path):
    # zero_lab calls launch.run three times in one process: the group is joined once.
    results = run_two_nodes(["lesson_code.zero_lab", "--steps", "2"], tmp_path / "logs")
    found = reports(results, "lesson 78")
    assert len(found) == 1
    assert "on 4 ranks" in found[0]
    assert "parameters identical on all ranks after every step: True" in found[0]


def test_collectives_on_two_nodes(tmp_path):
    results = run_two_nodes(["lesson_code.collectives_lab", "--length", "37"], tmp_path / "logs")
    found = reports(results, "lesson 76")
    assert len(found) == 1
    assert "4 ranks" in found[0] and "all results equal the built-ins" in found[0]


def test_two_nodes_holding_different_tables_choose_alike(tmp_path):
    # One node's ranks read a table in which the ring is fastest, the other's the package's.
    ring_fastest = write_ring_fastest(tmp_path / "ring-fastest")
    book = tmp_path / "no-table-here"  # an empty folder: the package's own times
    book.mkdir()
    script = str(Path(__file__).with_name("auto_on_nodes.py"))
    results = run_two_nodes([script], tmp_path / "logs",
                            [{RESULTS_VARIABLE: str(ring_fastest)}, {RESULTS_VARIABLE: str(book)}])
    found = reports(results, "auto on nodes: ")
    assert len(found) == 1
    per_rank = json.loads(found[0].split("auto on nodes: ", 1)[1].splitlines()[0])
    assert len(per_rank) == NODES * PROCESSES_PER_NODE
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        ranks = [result[collective] for result in per_rank]
        assert all(rank["right"] for rank in ranks), (collective, ranks)
        own = [rank["own"] for rank in ranks]
        assert "ring" in own and set(own) != {"ring"}, own  # the nodes' tables disagree here
        assert {rank["chosen"] for rank in ranks} == {own[0]}, (collective, ranks)  # rank 0's


def test_a_node_that_cannot_use_the_backend_stops_every_rank_at_once(tmp_path):
    # One node asks for NCCL (its LESSON_CODE_BACKEND), which a machine without GPUs cannot run:
    # every rank of both nodes must stop with that reason, none wait in a half-made group.
    start = time.monotonic()
    results = run_two_nodes(["lesson_code.collectives_lab", "--length", "37"], tmp_path / "logs",
                            [{"LESSON_CODE_BACKEND": "nccl"}, {"LESSON_CODE_BACKEND": "gloo"}])
    assert time.monotonic() - start < 60
    for node, (code, out, err) in enumerate(results):
        assert code != 0, f"agent {node} exited with 0:\n{out[-2000:]}"
        assert "not every rank can use backend 'auto', so none starts" in err, err[-3000:]
        assert "backend 'nccl' needs one CUDA device per rank" in err


def test_init_from_env_gives_the_worker_one_thread(monkeypatch):
    environment = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert launch.init_from_env(backend="gloo") == (0, 1)
        assert torch.get_num_threads() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
