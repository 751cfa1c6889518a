"""Lesson 81's properties, each a test on real ranks: (a)-(d) of the lesson, then (e)-(f).

Tolerance for (a): each step's loss is at most the previous one plus 1e-6 (float32 rounding of a
mean over 256 token losses); measured, every step falls by 0.008 or more (each of the 20 steps
reads another batch of the corpus). Then the runs that stop and go on: a replay from a
checkpoint, deliberately wrong resumes, the command killed and run again, and torchrun
restarting a killed rank.
"""

import dataclasses
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lesson_code import launch, memory
from lesson_code.collectives import cost_model
from lesson_code.capstone import cli as capstone_cli
from lesson_code.capstone.crash import crash_and_continue, same_tensors
from lesson_code.capstone.broken_resume import PIECES, resume_without
from lesson_code.capstone.report import read_metrics
from lesson_code.checkpoint.tools import list_checkpoints
from lesson_code.ddp_lab import attention_key_bias_mask
from lesson_code.capstone import CapstoneConfig, MiniGPT, run_rank, torch_baseline
from lesson_code.models import GPTConfig, gpt_parameters
from lesson_code.capstone.train import COMPARED, compare_resumed, run_and_resume, timed_run_rank
from lesson_code.capstone.tensor_parallel import (single_rank_gradients, single_rank_loss,
                                                  tensor_parallel_gradients, tensor_parallel_loss)
from lesson_code.experiment import flat_parameters
from lesson_code.data import batch_for_step
from lesson_code.harness.reference import in_one_rank
from tolerances import FLOAT32_RELATIVE, GRAD_NORM_RELATIVE, relative_distance
from wrong_variants import capstone_with_summed_gradients
from wrong_resumes import resume_without_guard_state

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    config = CapstoneConfig(out_dir=str(tmp_path_factory.mktemp("capstone")))
    return config, launch.spawn(run_rank, config, world_size=4)


def test_a_timed_run_counts_its_steps_and_saves_but_not_the_start_up(tmp_path):
    config = CapstoneConfig(out_dir=str(tmp_path), steps=4, checkpoint_step=2)
    results = launch.spawn(timed_run_rank, config, world_size=2)
    for result in results:
        steps = sum(row["step_time_s"] for row in result["records"])
        assert steps < result["run_s"] < 60  # the steps, plus the build and the two saves
    assert [row["loss"] for row in results[0]["records"]] == [
        row["loss"] for row in launch.spawn(run_rank, dataclasses.replace(
            config, out_dir=str(tmp_path / "plain")), world_size=2)[0]["records"]]


def losses(results):
    return [r["loss"] for r in results[0]["records"]]


def test_a_the_loss_falls_at_every_step(clean_run):
    _, results = clean_run
    values = losses(results)
    assert len(values) == 20
    assert all(b <= a + 1e-6 for a, b in zip(values, values[1:]))
    assert values[-1] < values[0] - 1.0


def test_b_every_rank_has_the_same_parameter_norm_at_every_step(clean_run):
    _, results = clean_run
    norms = [[row["param_norm"] for row in r["records"]] for r in results]
    assert all(n == norms[0] for n in norms)
    assert all(torch.equal(r["params"], results[0]["params"]) for r in results)


def test_c_optimizer_bytes_per_rank_are_12_p_over_n(clean_run):
    _, results = clean_run
    numel = results[0]["numel"]
    assert numel == 30080 and results[0]["padding"] == 0
    assert all(r["memory"]["optimizer"] == 12 * numel // 4 for r in results)
    # Lesson 81's explorer draws memory.capstone_bytes: what the tensors' storage holds.
    assert all(r["memory"] == memory.capstone_bytes(numel, len(results)) for r in results)
    assert numel == gpt_parameters(GPTConfig())


def test_zero_1_sends_per_step_what_an_all_reduce_of_the_gradients_sends(clean_run):
    # Lesson 81's traffic table: the ledger of each rank's ring communicator, over 20 steps.
    config, results = clean_run
    numel, world_size = results[0]["numel"], len(results)
    masks = config.gpt.n_layer * config.gpt.context ** 2  # the causal masks, broadcast as buffers
    for result in results:
        traffic = result["traffic"]
        per_step = (traffic["reduce_scatter"]["bytes_sent"] + traffic["all_gather"]["bytes_sent"]) / 20
        assert per_step == cost_model.bytes_per_rank("all_reduce", 4 * numel, world_size) == 180480
        assert traffic["broadcast"]["calls"] == 2 and traffic["reduce_scatter"]["calls"] == 20
    received = [r["traffic"]["broadcast"]["bytes_received"] for r in results]
    assert received == [0, 4 * numel + masks, 4 * numel + masks, 4 * numel + masks]


def test_d_the_step_10_checkpoint_restores_byte_for_byte(clean_run):
    _, results = clean_run
    assert all(r["resume_verified"] == {10: True, 20: True} for r in results)  # and the last's


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """The default run, then a replay from its step-10 checkpoint (`run_and_resume`)."""
    config = CapstoneConfig(out_dir=str(tmp_path_factory.mktemp("resumed")))
    both = launch.spawn(run_and_resume, config, world_size=4)
    return config, [r["straight"] for r in both], [r["resumed"] for r in both]


def test_the_default_run_reads_another_batch_at_every_step():
    config = CapstoneConfig()
    corpus = config.corpus()
    batches = [batch_for_step(corpus, step, 0, 1, config.batch_size, config.gpt.context)[0]
               for step in range(config.steps)]
    assert all(not torch.equal(a, b) for i, a in enumerate(batches) for b in batches[i + 1:])


def test_e_resuming_at_10_ends_exactly_where_the_uninterrupted_run_ends(resumed_run):
    config, straight, resumed = resumed_run
    assert [row["step"] for row in resumed[0]["records"]] == list(range(11, 21))
    assert [row["step"] for row in resumed[0]["history"]["records"]] == list(range(1, 11))
    assert losses(resumed) == losses(straight)[10:]
    verdicts = compare_resumed(straight, resumed)
    assert list(verdicts) == ["steps and losses", *COMPARED] and all(verdicts.values())
    assert all(torch.equal(a["params"], b["params"]) for a, b in zip(straight, resumed))
    assert sorted(p.name for p in Path(config.out_dir).iterdir()) == ["checkpoints", "metrics.jsonl"]


def test_e_names_what_each_resume_that_leaves_a_piece_out_changes(resumed_run, tmp_path):
    # Lesson 81's exercise 6: each piece left out changes its own items of check (e), while each
    # checkpoint the broken run saves still reloads byte for byte (check (d) cannot see it).
    config, straight, _ = resumed_run
    expected = {"data position": ({"steps and losses", "params", "master", "exp_avg", "exp_avg_sq"}, 11),
                "optimizer state": ({"steps and losses", "params", "master", "exp_avg", "exp_avg_sq",
                                     "optimizer_step"}, 12),
                "RNG state": ({"rng_state"}, None)}
    assert set(expected) == set(PIECES)
    for piece, (what_differs, first) in expected.items():
        wrong = launch.spawn(resume_without, dataclasses.replace(config, out_dir=str(tmp_path / piece)),
                             straight[0]["checkpoints"][10], piece, world_size=4)
        verdicts = compare_resumed(straight, wrong)
        assert {name for name, same in verdicts.items() if not same} == what_differs, piece
        assert all(r["resume_verified"] == {20: True} for r in wrong)
        other = [row["step"] for row, same in zip(wrong[0]["records"], straight[0]["records"][10:])
                 if row["loss"] != same["loss"]]
        assert (other[0] if other else None) == first, piece
    with pytest.raises(ValueError, match="piece must be one of"):
        resume_without(0, 4, config, straight[0]["checkpoints"][10], "guard")


def test_a_resume_restores_the_guard_that_rejects_the_next_step(tmp_path):
    # Step 11's batch is mislabelled (its loss about 1.2 times step 10's): the guard, holding
    # step 10's loss, rejects it, rolls back to step 10 and skips it. A resume from step 10
    # must reject it too, so it needs the guard's state from the checkpoint.
    config = CapstoneConfig(out_dir=str(tmp_path / "run"), steps=14, bad_batch_step=11,
                            spike_factor=1.15, skip_after_rollback=True)
    both = launch.spawn(run_and_resume, config, world_size=4)
    straight, resumed = [r["straight"] for r in both], [r["resumed"] for r in both]
    assert [(e["to_step"], e["at_step"]) for e in straight[0]["events"]] == [(10, 11)]
    assert resumed[0]["events"] == straight[0]["events"]  # the replay rolled back alike
    assert all(compare_resumed(straight, resumed).values())
    wrong = launch.spawn(resume_without_guard_state,
                         dataclasses.replace(config, out_dir=str(tmp_path / "wrong")),
                         straight[0]["checkpoints"][10], world_size=4)
    assert wrong[0]["events"] == []  # a fresh guard let the bad batch through
    assert not compare_resumed(straight, wrong)["params"]


def test_the_capstone_runs_on_8_ranks(tmp_path):
    # The corpus grows with the world size: 8 ranks read 20 batches of 32 sequences.
    config = CapstoneConfig(out_dir=str(tmp_path), world_size=8, steps=2, checkpoint_step=1)
    results = launch.spawn(run_rank, config, world_size=8)
    assert config.corpus_tokens == 20 * 32 * 17
    assert [row["step"] for row in results[0]["records"]] == [1, 2]
    assert all(r["resume_verified"] == {1: True, 2: True} for r in results)


def test_f_two_runs_with_the_same_seed_print_identical_loss_tables(clean_run, tmp_path):
    config, results = clean_run
    again = launch.spawn(run_rank, dataclasses.replace(config, out_dir=str(tmp_path)), world_size=4)
    assert losses(again) == losses(results)


def run_changed(tmp_path, **changes):
    """The clean run's config with `changes`, trained on 4 ranks: (config, every rank's result)."""
    config = CapstoneConfig(out_dir=str(tmp_path), **changes)
    return config, launch.spawn(run_rank, config, world_size=4)


def test_the_divergence_guard_rolls_back_a_learning_rate_spike(clean_run, tmp_path):
    _, clean = clean_run
    _, results = run_changed(tmp_path, lr_spike_step=13)
    events = results[0]["events"]
    assert len(events) == 1 and events[0]["to_step"] == 10 and "more than 2 times" in events[0]["reason"]
    # The log marks the updates the rollback threw away: steps 11 to 13, the spiked one included.
    assert events[0]["undone"] == [11, 12, 13]
    assert [row.get("event") for row in read_metrics(tmp_path / "metrics.jsonl")].index("rollback") == 13
    final = results[0]["records"][-1]
    assert final["step"] == 20 and final["loss"] == losses(clean)[-1]  # replayed exactly
    assert torch.equal(results[0]["params"], clean[0]["params"])


def test_an_update_that_breaks_the_weights_is_rolled_back_before_a_checkpoint_keeps_it(clean_run,
                                                                                      tmp_path):
    # The spike multiplies step 10's update, and a checkpoint follows step 10. Step 11's loss
    # would show the damage only after that checkpoint had kept it, and a rollback would reload
    # it. Judged before the save, the update goes back to step 5's checkpoint instead.
    _, clean = clean_run
    _, results = run_changed(tmp_path / "with-5", lr_spike_step=10, save_also=(5,))
    events = results[0]["events"]
    assert [(e["event"], e["to_step"], e["at_step"]) for e in events] == [("rollback", 5, 10)]
    assert events[0]["undone"] == [6, 7, 8, 9, 10]
    assert torch.equal(results[0]["params"], clean[0]["params"])  # replayed exactly
    # With no checkpoint before the broken update, the run stops instead of saving it.
    with pytest.raises(Exception, match="diverged before any checkpoint"):
        run_changed(tmp_path / "without", lr_spike_step=10, steps=10)


def test_gradient_accumulation_over_4_micro_batches_equals_one_batch(clean_run, tmp_path):
    _, clean = clean_run
    config, results = run_changed(tmp_path, accumulation=4)
    assert max(abs(a - b) for a, b in zip(losses(results), losses(clean))) < 1e-5
    # Micro-batches sum the gradient in another order; Adam walks the attention key biases,
    # whose true gradient is zero, on that rounding noise (see tests/dist/test_ddp.py), so they
    # are held only by the whole run's relative distance (tests/dist/tolerances.py).
    keys = attention_key_bias_mask(MiniGPT(config.gpt))
    diff = (results[0]["params"] - clean[0]["params"]).abs()
    assert diff[~keys].max() < 1e-5
    torch.manual_seed(config.seed)  # rank 0's initial model, which the broadcast gives every rank
    start = flat_parameters(MiniGPT(config.gpt))
    assert relative_distance(results[0]["params"], clean[0]["params"], start) < FLOAT32_RELATIVE


def test_built_before_the_broadcast_the_ranks_agree_but_train_a_patchwork(clean_run, tmp_path):
    _, clean = clean_run
    config, results = run_changed(tmp_path, optimizer_before_broadcast=True)
    norms = [[row["param_norm"] for row in r["records"]] for r in results]
    assert all(n == norms[0] for n in norms)  # (b) holds: every rank gathers the same patchwork
    wrong, right = losses(results), losses(clean)
    assert wrong[0] == right[0]  # step 1 runs on the broadcast weights
    assert min(abs(a - b) for a, b in zip(wrong[1:], right[1:])) > 1e-3  # then other weights
    torch.manual_seed(config.seed)
    start = flat_parameters(MiniGPT(config.gpt))
    assert relative_distance(results[0]["params"], clean[0]["params"], start) > 1


@pytest.fixture(scope="module")
def one_process(clean_run, tmp_path_factory):
    """The reference of check (r): one process trains the whole global batch with torch.optim.Adam
    from rank 0's initial weights (the torch twin on a world of one rank)."""
    config, _ = clean_run
    one = dataclasses.replace(config, out_dir=str(tmp_path_factory.mktemp("one")), world_size=1,
                              batch_per_rank=config.world_size * config.batch_per_rank)
    return in_one_rank(torch_baseline.run_rank, 0, 1, one)


def gaps_from(results, twin, config):
    """Check (r)'s three numbers: the largest loss gap, the final parameters' relative distance,
    the largest relative gap of the gradient norms."""
    torch.manual_seed(config.seed)  # rank 0's initial model, which the broadcast gives every rank
    start = flat_parameters(MiniGPT(config.gpt))
    norms = [row["grad_norm"] for row in results[0]["records"]]
    return (max(abs(a - b) for a, b in zip(losses(results), twin["losses"])),
            relative_distance(results[0]["params"], twin["params"], start),
            max(abs(a - b) / b for a, b in zip(norms, twin["grad_norms"])))


def test_the_default_run_matches_one_process_with_torch_adam(clean_run, one_process):
    # The reference check (r) of lesson 81 for the default, unclipped run.
    config, results = clean_run
    assert len(one_process["losses"]) == len(one_process["grad_norms"]) == config.steps
    assert one_process["moment_bytes"] == 8 * results[0]["numel"]  # one rank holds both moments whole
    loss_gap, distance, norm_gap = gaps_from(results, one_process, config)
    assert loss_gap < 1e-5 and distance < FLOAT32_RELATIVE and norm_gap < GRAD_NORM_RELATIVE


def test_r_sees_gradients_summed_where_the_mean_is_due(clean_run, one_process, tmp_path):
    # A reduce-scatter with op="sum" makes every gradient 4 times too large. Adam divides by the
    # gradient's scale, so the losses and the final parameters stay within their bounds; only
    # the gradient norm, 4 times the reference's at every step, shows the bug.
    config, _ = clean_run
    summed = launch.spawn(capstone_with_summed_gradients,
                          dataclasses.replace(config, out_dir=str(tmp_path)), world_size=4)
    loss_gap, distance, norm_gap = gaps_from(summed, one_process, config)
    assert loss_gap < 1e-5 and distance < FLOAT32_RELATIVE  # what check (r) compared before
    assert norm_gap > GRAD_NORM_RELATIVE
    ratios = [row["grad_norm"] / b for row, b in zip(summed[0]["records"], one_process["grad_norms"])]
    assert all(abs(ratio - 4) < 1e-3 for ratio in ratios)


def test_exercise_4_clipping_across_shards_matches_torch_clipping_in_one_process(clean_run, tmp_path):
    _, clean = clean_run
    config, results = run_changed(tmp_path / "ranks", max_grad_norm=0.3)  # every norm here is ~0.6
    one = dataclasses.replace(config, out_dir=str(tmp_path / "one"), world_size=1,
                              batch_per_rank=config.world_size * config.batch_per_rank)
    twin = in_one_rank(torch_baseline.run_rank, 0, 1, one)  # clip_grad_norm_, then Adam
    loss_gap, distance, norm_gap = gaps_from(results, twin, config)
    assert loss_gap < 1e-5 and distance < FLOAT32_RELATIVE and norm_gap < GRAD_NORM_RELATIVE
    assert max(abs(a - b) for a, b in zip(losses(results), losses(clean))) > 1e-3  # it clipped


def test_tensor_parallel_attention_of_page_81a_matches_one_rank():
    config = CapstoneConfig()
    split = launch.spawn(tensor_parallel_loss, config, world_size=2)
    assert split[0] == split[1]
    assert abs(split[0] - in_one_rank(single_rank_loss, config)) < 1e-5


def test_tensor_parallel_of_page_81a_trained_through_f_and_g_the_split_gives_the_one_rank_gradient():
    # g's backward must be the identity: a differentiable all-reduce (funcol) sums the gradient
    # again and is caught by the same comparison. Float32 rounding of one backward pass is near
    # 1e-7 relative; the wrong g is off by tens of percent.
    config = CapstoneConfig()
    reference = in_one_rank(single_rank_gradients, config)
    right = launch.spawn(tensor_parallel_gradients, config, world_size=2)
    wrong = launch.spawn(tensor_parallel_gradients, config, True, world_size=2)
    assert torch.equal(right[0], right[1])
    assert (right[0] - reference).norm() < 1e-5 * reference.norm()
    assert (wrong[0] - reference).norm() > 0.1 * reference.norm()


def test_the_last_line_says_what_the_resume_checks_compared():
    # RESUME VERIFIED is followed by which run was compared with which, from which checkpoint,
    # which steps' losses and what state; RESUME FAILED names what differed. No ranks needed.
    config, every = CapstoneConfig(), dict.fromkeys(["steps and losses", *COMPARED], True)
    assert capstone_cli.verdict_line(config, 4, True, every, "en", 10, False, [10, 20]) == (
        "RESUME VERIFIED: a run resumed from the step-10 checkpoint matched this run bit for bit on "
        "all 4 ranks: the same losses in steps 11 to 20 and, after step 20, the same parameters, "
        "optimizer state and RNG state; the checkpoints of steps 10, 20 reload byte for byte")
    continued = capstone_cli.verdict_line(dataclasses.replace(config, steps=12), 4, True, every,
                                          "en", 8, True, [4, 8, 12])
    assert continued.startswith("RESUME VERIFIED: this run, continued from the step-8 checkpoint, "
                                "matched a run from step 0 that never stopped") and "steps 1 to 12" in continued
    persian = capstone_cli.verdict_line(config, 4, True, every, "fa", 10, False, [10, 20])
    # In Persian what held is a line of its own, starting with a Persian word (so it reads right
    # to left); the last line keeps RESUME VERIFIED first for scripts, and is short.
    explained, last = persian.splitlines()
    assert explained.startswith("اجرایی که از چکپوینت گام ۱۰") and "گام‌های ۱۱ تا ۲۰" in explained
    assert last == "RESUME VERIFIED: ادامهٔ آموزش وارسی شد"
    persian_failed = capstone_cli.verdict_line(config, 4, True, {**every, "exp_avg": False}, "fa")
    assert persian_failed.splitlines()[-1].startswith("RESUME FAILED: ")
    assert persian_failed.splitlines()[0] == "بیت‌به‌بیت برابر نبود: گشتاور اول Adam"
    failed = capstone_cli.verdict_line(config, 4, False, {**every, "exp_avg": False}, "en")
    assert failed == ("RESUME FAILED: a checkpoint does not reload byte for byte; "
                      "not equal bit for bit: exp_avg")


def test_the_torch_twin_saves_a_checkpoint_a_run_could_continue_from(tmp_path):
    # The twin of lesson 81's timing table: DCP writes the model, and rank 0 the optimizer state
    # that ZeroRedundancyOptimizer gathered to it, every parameter's Adam state after 2 steps.
    config = CapstoneConfig(out_dir=str(tmp_path), world_size=2, steps=3, checkpoint_step=2)
    results = launch.spawn(torch_baseline.run_rank, config, world_size=2)
    assert len(results[0]["losses"]) == 3 and torch.equal(results[0]["params"], results[1]["params"])
    folder = tmp_path / "dcp-step-2"
    assert (folder / ".metadata").is_file()
    state = torch.load(folder / "optimizer.pt")["state"]
    shapes = [tuple(p.shape) for p in MiniGPT(config.gpt).parameters()]
    assert sorted(state) == list(range(len(shapes)))
    assert all(float(state[i]["step"]) == 2 and tuple(state[i]["exp_avg_sq"].shape) == shape
               for i, shape in enumerate(shapes))


def run_command(command, tmp_path):
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=600)


def test_the_command_prints_the_report_and_writes_metrics(tmp_path, capsys):
    completed = run_command([sys.executable, "-m", "lesson_code.capstone", "--out-dir", "run"], tmp_path)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    out = completed.stdout
    assert out.rstrip().splitlines()[-1] == capstone_cli.verdict_line(
        CapstoneConfig(), 4, True, dict.fromkeys(["steps and losses", *COMPARED], True), "en", 10,
        False, [10, 20])
    assert out.splitlines()[1] == "started fresh at step 0: no checkpoint to continue from in run/checkpoints"
    assert "resume check 1: step-10, step-20 checkpoint(s) reloaded" in out
    assert "resume check 2: resumed from step 10" in out
    compared = [line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  ")
                and line.rstrip().endswith((": True", ": False"))]
    assert compared == ["steps and losses", *COMPARED] and ": False" not in out
    lines = out.splitlines()
    loss_rows = [line for line in lines if re.match(r"^\s*\d+\s+\d+\.\d{5}\s", line)]
    assert [int(row.split()[0]) for row in loss_rows] == list(range(1, 21))
    header = lines.index("rank  parameters  gradients  optimizer  12P/N")
    memory_rows = [line.split() for line in lines[header + 1: header + 5]]
    assert [row[0] for row in memory_rows] == ["0", "1", "2", "3"]
    assert all(row[3] == row[4] == str(12 * 30080 // 4) for row in memory_rows)
    assert "manifest sha256 verified" in out and "shard-00003-of-00004.pt" in out
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    assert {"loss", "grad_norm", "step_time_s"} <= set(metrics[0])
    assert (run / "loss.png").stat().st_size > 1000
    summary = json.loads((run / "run.json").read_text())
    assert summary["started"]["from_step"] is None and summary["verified"] is True
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "loss.png", "metrics.jsonl", "run.json"]
    # Started again with other settings, the command refuses to continue this run, before any rank.
    for arguments, named in ((["--seed", "1"], "its seed is 0, this run's is 1 (--seed)"),
                             (["--world-size", "2"], "saved by 4 ranks, but this run has 2 (--world-size)")):
        with pytest.raises(SystemExit) as caught:
            capstone_cli.main(["--out-dir", str(run), *arguments])
        error = capsys.readouterr().err
        assert caught.value.code == 2 and named in error and "--fresh" in error, error
    assert [folder.name for _, folder in list_checkpoints(run / "checkpoints")] == \
        ["step-00000010", "step-00000020"]


def test_a_killed_run_started_again_ends_bitwise_where_an_uninterrupted_run_ends(tmp_path):
    # The last rank kills itself after step 5; the same command, run again, continues from the
    # step-4 checkpoint (lesson 81's crash_and_continue, three commands with spawned ranks).
    result = crash_and_continue(tmp_path, steps=6, checkpoint_every=2, kill_at_step=5)
    assert [row["step"] for row in result.killed] == [1, 2, 3, 4, 5]
    assert (result.crash_step, result.resume_step, result.restarted_steps) == (5, 4, 1)
    assert [row["step"] for row in result.continued] == list(range(1, 7))
    curve = lambda rows: [(row["step"], row["loss"]) for row in rows]  # noqa: E731
    assert curve(result.killed) == curve(result.uninterrupted)[:5]  # logged as it trained
    assert result.same_losses and result.same_checkpoint
    assert result.report.startswith("resume check 1: the step-4 checkpoint this run continued from")
    assert result.report.splitlines()[-1].startswith(
        "RESUME VERIFIED: this run, continued from the step-4 checkpoint, matched a run from step 0 "
        "that never stopped bit for bit on all 4 ranks: the same losses in steps 1 to 6 and, after "
        "step 6, the same parameters") and ": False" not in result.report
    assert set(result.seconds) == {"killed", "continued", "uninterrupted"}


def test_a_run_continued_with_no_check_trains_only_its_own_steps(clean_run, tmp_path):
    # With --no-check a continued run trains from its checkpoint on and nothing else: a file left
    # in out_dir/verify, the checks' scratch folder that an uninterrupted run from step 0 would
    # clear and fill, is still there; the losses are still the default run's.
    config, clean = clean_run
    first = run_command([sys.executable, "-m", "lesson_code.capstone", "--out-dir", "run",
                         "--steps", "6", "--checkpoint-step", "6", "--no-check"], tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    marker = tmp_path / "run" / "verify" / "left-here"
    marker.parent.mkdir()
    marker.write_text("untouched")
    second = run_command([sys.executable, "-m", "lesson_code.capstone", "--out-dir", "run",
                          "--steps", "8", "--checkpoint-step", "6", "--no-check"], tmp_path)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    out = second.stdout
    assert out.splitlines()[1].startswith("resumed from step 6: run/checkpoints/step-00000006")
    assert marker.read_text() == "untouched"
    assert out.rstrip().splitlines()[-1] == ("RESUME NOT CHECKED (--no-check): the run trained to "
                                             "step 8 on 4 ranks, no run from another start was "
                                             "compared with it")
    assert "resume check not run (--no-check)" in out and "RESUME VERIFIED" not in out
    run = tmp_path / "run"
    assert [m["loss"] for m in read_metrics(run / "metrics.jsonl")] == losses(clean)[:8]
    summary = json.loads((run / "run.json").read_text())
    assert summary["started"]["from_step"] == 6 and summary["checked"] is False
    assert [folder.name for _, folder in list_checkpoints(run / "checkpoints")] == \
        ["step-00000006", "step-00000008"]


def test_torchrun_restarts_a_killed_rank_and_the_run_goes_on_from_its_checkpoint(clean_run, tmp_path):
    # Rank 3 kills itself after step 12; torchrun's agent restarts the group, which continues
    # from the step-10 checkpoint, although the command says --fresh (a first attempt's word),
    # and ends with the default run's every loss and every tensor of its last checkpoint.
    config, clean = clean_run
    torchrun = Path(sys.executable).with_name("torchrun")
    completed = run_command([str(torchrun), "--standalone", "--nproc-per-node=4", "--max-restarts=2",
                             "-m", "lesson_code.capstone", "--out-dir", "run", "--checkpoint-every",
                             "5", "--kill-at-step", "12", "--fresh"], tmp_path)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    out = completed.stdout
    assert out.count("RESUME VERIFIED") == 1
    assert out.splitlines()[1].startswith("resumed from step 10: run/checkpoints/step-00000010")
    assert "torchrun has restarted the ranks 1 time(s)" in out
    assert json.loads((tmp_path / "run" / "run.json").read_text())["started"]["restarts"] == 1
    run = tmp_path / "run"
    assert [m["loss"] for m in read_metrics(run / "metrics.jsonl")] == losses(clean)
    assert same_tensors(run / "checkpoints" / "step-00000020",
                        Path(config.out_dir) / "checkpoints" / "step-00000020", world_size=4)
