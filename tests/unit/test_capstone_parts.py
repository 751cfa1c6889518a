"""Capstone pieces that need no ranks: the corpus, batches, the guard, the config, the report."""

import dataclasses
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from lesson_code.capstone import CapstoneConfig, make_corpus
from lesson_code.data import batch_for_step
from lesson_code.experiment import RunConfig
from lesson_code.capstone.guard import DivergenceGuard
from lesson_code.capstone.cli import (parse_arguments, restarts_share_a_store, resume_report,
                                      unchecked_report, verdict_line,
                                      start_line)
from lesson_code.capstone.crash import CrashAndResume
from lesson_code.capstone.report import (MetricsLog, loss_table, manifest_summary, read_metrics,
                                         reason_text, write_metrics)
from lesson_code.checkpoint import files
from lesson_code.checkpoint.files import write_file, write_manifest
from lesson_code.language import persian_digits
from lesson_code.capstone.resume import check_checkpoint
from lesson_code.capstone.train import restore_run_state
from lesson_code.plots.capstone import TABLE_WORDS


def test_corpus_is_deterministic_and_mostly_follows_its_chain():
    a, b = make_corpus(0, 5000), make_corpus(0, 5000)
    assert torch.equal(a, b) and not torch.equal(a, make_corpus(1, 5000))
    successor = {}
    for prev, nxt in zip(a[:-1].tolist(), a[1:].tolist()):
        successor.setdefault(prev, []).append(nxt)
    top = sum(max(map(v.count, set(v))) for v in successor.values()) / (len(a) - 1)
    assert 0.85 < top < 0.95  # 90% of transitions follow the chain
    with pytest.raises(ValueError):
        make_corpus(0, 1)


def test_the_chain_entropy_is_about_0_73_nats_as_make_corpus_says():
    # Lesson 81 quotes it: the loss a model that learnt the table would reach.
    tokens = make_corpus(0, 200_000).tolist()
    pairs = Counter(zip(tokens[:-1], tokens[1:]))
    before = Counter(tokens[:-1])
    entropy = -sum(n / (len(tokens) - 1) * math.log(n / before[a]) for (a, _), n in pairs.items())
    likely, other = 0.9 + 0.1 / 64, 0.1 / 64
    exact = -(likely * math.log(likely) + 63 * other * math.log(other))
    assert round(exact, 2) == 0.73 and abs(entropy - exact) < 0.02
    assert "about 0.73 nats" in " ".join(make_corpus.__doc__.split())


def test_batches_split_the_global_batch_by_rank_and_advance_with_the_step():
    corpus = make_corpus(0, 4 * 272)
    x0, y0 = batch_for_step(corpus, 0, 0, 4, 4, 16)
    assert x0.shape == y0.shape == (4, 16) and torch.equal(x0[:, 1:], y0[:, :-1])
    assert not torch.equal(x0, batch_for_step(corpus, 0, 1, 4, 4, 16)[0])
    assert not torch.equal(x0, batch_for_step(corpus, 1, 0, 4, 4, 16)[0])
    assert torch.equal(x0, batch_for_step(corpus, 4, 0, 4, 4, 16)[0])  # wraps after 4 steps
    with pytest.raises(ValueError, match="make it larger"):
        batch_for_step(make_corpus(0, 100), 0, 0, 4, 4, 16)


def test_guard_accepts_falling_losses_and_names_spikes_and_nans():
    guard = DivergenceGuard(spike_factor=2.0)
    assert guard.check(4.0) is None and guard.check(3.0) is None
    assert "more than 2 times" in guard.check(6.5)
    assert guard.previous == 3.0  # a rejected loss is not remembered
    assert "not finite" in guard.check(math.nan)
    assert "not finite" in guard.check(math.inf)


def test_after_a_rollback_the_guard_replays_by_default_and_skips_when_asked():
    # Rolled back to the step-10 checkpoint because step 13 was rejected.
    assert DivergenceGuard().resume_at(10, 13) == 10  # replay steps 11, 12, 13
    assert DivergenceGuard(skip_after_rollback=True).resume_at(10, 13) == 13  # next: step 14
    with pytest.raises(ValueError, match="restored=13, rejected=13"):
        DivergenceGuard().resume_at(13, 13)


def test_config_rejects_inconsistent_settings():
    with pytest.raises(ValueError, match="checkpoint_step=30"):
        CapstoneConfig(checkpoint_step=30)
    with pytest.raises(ValueError, match="accumulation=3"):
        CapstoneConfig(accumulation=3)
    with pytest.raises(ValueError, match="kill_at_step=21 must be in 1..steps=20"):
        CapstoneConfig(kill_at_step=21)
    with pytest.raises(ValueError, match="kill_rank=4 must be a rank of the world: 0..3"):
        CapstoneConfig(kill_at_step=3, kill_rank=4)
    with pytest.raises(ValueError, match="need kill_at_step"):
        CapstoneConfig(kill_during_save=True)
    with pytest.raises(ValueError, match=r"no checkpoint is saved after step 3; saves follow steps \[10, 20\]"):
        CapstoneConfig(kill_at_step=3, kill_during_save=True)


def test_checkpoints_are_saved_after_the_checkpoint_step_every_k_steps_and_the_last():
    assert CapstoneConfig().save_steps() == {10, 20}
    assert CapstoneConfig(steps=12, checkpoint_step=3, checkpoint_every=4).save_steps() == {3, 4, 8, 12}
    assert CapstoneConfig(save_also=(7,)).save_steps() == {7, 10, 20}
    assert CapstoneConfig(kill_at_step=5).victim() == 3 and CapstoneConfig().victim() is None
    assert CapstoneConfig(kill_at_step=5, kill_rank=0, kill_during_save=False).disarmed() == CapstoneConfig()


def checkpoint_of(config, world_size=None, **changed):
    """A manifest as `run_rank` writes it for `config`, with `changed` settings in its run state."""
    return {"world_size": world_size or config.world_size, "step": 10,
            "extra": {"next_step": 10, "run": {"config": {**config.trajectory(), **changed}}}}


def test_only_a_checkpoint_of_this_very_run_may_be_continued(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    config = CapstoneConfig()
    check_checkpoint(checkpoint_of(config), "run/checkpoints/step-00000010", config)  # no error
    with pytest.raises(ValueError, match=r"its seed is 3, this run's is 0 \(--seed\); continue it with "
                                         r"the same settings, or pass another --out-dir"):
        check_checkpoint(checkpoint_of(config, seed=3), "run/checkpoints/step-00000010", config)
    shaped = {**config.trajectory()["gpt"], "n_layer": 3}
    with pytest.raises(ValueError, match="its gpt is .*'n_layer': 3"):
        check_checkpoint(checkpoint_of(config, gpt=shaped), "f", config)
    with pytest.raises(ValueError, match="its batch_per_rank is 2, this run's is 4"):
        check_checkpoint(checkpoint_of(config, batch_per_rank=2), "f", config)
    with pytest.raises(ValueError, match=r"saved by 8 ranks, but this run has 4 \(--world-size\)"
                                         r": continue it on 8 ranks"):
        check_checkpoint(checkpoint_of(config, world_size=8), "f", config)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"saved by 8 ranks, but this run has 4 \(torchrun's "
                                         r"WORLD_SIZE, set by torchrun's --nnodes x --nproc-per-node\)"):
        check_checkpoint(checkpoint_of(config, world_size=8), "f", config)
    lesson_80 = {"world_size": 4, "step": 3, "extra": {"next_step": 3}}
    with pytest.raises(ValueError, match="was not saved by lesson_code.capstone"):
        check_checkpoint(lesson_80, "f", config)
    # What may change between attempts: the length, the save schedule, the folder, the crash.
    later = dataclasses.replace(config, steps=40, checkpoint_every=5, out_dir="elsewhere", kill_at_step=3)
    check_checkpoint(checkpoint_of(config), "f", later)


def test_a_resume_needs_the_run_state_of_a_capstone_checkpoint():
    guard = DivergenceGuard()
    state = {"config": {}, "world_size": 4, "guard": {"previous": 3.5, "retries": {"13": 1}},
             "lr_spiked": True, "records": [{"step": 1, "loss": 4.0}], "events": []}
    assert restore_run_state({"next_step": 10, "run": state}, guard) == \
        (10, True, {"records": [{"step": 1, "loss": 4.0}], "events": []})
    assert (guard.previous, guard.retries) == (3.5, {13: 1})
    with pytest.raises(ValueError, match="holds no capstone run state"):
        restore_run_state({"next_step": 10}, DivergenceGuard())


def test_the_config_is_a_run_whose_global_batch_is_derived_from_the_ranks():
    config = CapstoneConfig()
    assert isinstance(config, RunConfig) and config.model == "gpt"
    assert (config.steps, config.seed, config.comm) == (20, 0, "ring")
    assert config.batch_size == config.world_size * config.batch_per_rank == 16
    assert config.corpus_tokens == 20 * 16 * 17  # 20 distinct global batches of 17-token windows
    two = dataclasses.replace(config, world_size=2)
    assert two.batch_size == 8 and two.corpus_tokens == 20 * 8 * 17  # derived again, never copied
    assert dataclasses.replace(config, world_size=8).corpus_tokens == 20 * 32 * 17
    with pytest.raises(TypeError):
        CapstoneConfig(model="mlp")  # the capstone trains MiniGPT only
    with pytest.raises(TypeError):
        CapstoneConfig(batch_size=32)  # set world_size or batch_per_rank instead
    with pytest.raises(TypeError):
        CapstoneConfig(corpus_tokens=1000)  # set corpus_batches instead
    corpus = make_corpus(config.seed, config.corpus_tokens, config.gpt.vocab_size)
    assert torch.equal(config.corpus(), corpus)
    for rank in range(config.world_size):  # RunConfig's slice of the global batch is the rank's
        mine = batch_for_step(corpus, 3, rank, config.world_size, config.batch_per_rank, 16)
        assert all(torch.equal(a, b) for a, b in zip(config.local_batch(3, rank, 4), mine))


def test_metrics_round_trip_and_table(tmp_path):
    records = [{"step": 1, "loss": 4.0, "grad_norm": 0.5, "step_time_s": 0.01, "lr": 1e-3,
                "param_norm": 50.0}]
    path = write_metrics(tmp_path / "m.jsonl", records, [{"event": "rollback", "to_step": 1}])
    assert read_metrics(path) == [{k: v for k, v in records[0].items() if k != "param_norm"},
                                  {"event": "rollback", "to_step": 1}]
    assert "4.00000" in loss_table(records)


def test_the_report_speaks_persian_with_the_same_numbers():
    records = [{"step": 1, "loss": 4.0, "grad_norm": 0.5, "step_time_s": 0.01, "param_norm": 50.0}]
    english, persian = loss_table(records, "en").splitlines(), loss_table(records, "fa").splitlines()
    assert english[1:] == persian[1:] and english[0] != persian[0]  # only the words change
    guard = DivergenceGuard(spike_factor=2.0)
    guard.check(2.5)
    assert reason_text(guard.check(129.3), "fa") == "زیان ۱۲۹٫۳ بیش از ۲ برابر زیان گام قبل (۲٫۵) است"
    assert reason_text(guard.check(math.nan), "fa") == "زیان nan است و متناهی نیست"
    assert reason_text("another reason", "fa") == "another reason"  # never a wrong translation
    resumed = {"steps and losses": True, "params": True, "rng_state": False}
    report = resume_report(CapstoneConfig(), 4, True, resumed, "fa", saved=[10, 20])
    assert "گام‌ها و زیان‌ها: بله" in report and "وضعیت مولد اعداد تصادفی: خیر" in report
    assert report.count(": بله") == 3 and "True" not in report and "resume check" not in report
    assert "چکپوینت‌های گام ۱۰ و گام ۲۰،" in report  # a Persian list, its last item after «و»
    verdict = verdict_line(CapstoneConfig(), 4, True, {"params": True}, "fa", saved=[10, 20])
    assert verdict.splitlines()[0].endswith("چکپوینت‌های گام‌های ۱۰ و ۲۰ نیز بایت‌به‌بایت بازیابی می‌شوند.")  # a sentence
    assert verdict_line(CapstoneConfig(), 4, True, {"params": True}, saved=[10, 20]).endswith(
        "the checkpoints of steps 10, 20 reload byte for byte")
    english = resume_report(CapstoneConfig(), 4, True, resumed, saved=[10, 20])
    assert english.startswith("resume check 1: step-10, step-20 checkpoint(s) reloaded")
    assert english.count(": True") == 3 and "  rng_state: False" in english
    assert "چکپوینت گام ۸، که این اجرا از آن ادامه یافت،" in resume_report(
        CapstoneConfig(), 4, True, resumed, "fa", from_step=8, continued=True)


def test_a_run_without_the_check_says_so_in_both_languages(tmp_path, capsys):
    # --no-check: no second run, so the report says the check was not run; the checkpoints'
    # reload at each save is still reported, and a checkpoint that did not reload fails the run.
    config = CapstoneConfig(steps=8, checkpoint_step=6)
    started = {"from_step": 6, "folder": "run/checkpoints/step-00000006", "skipped": [], "restarts": 1}
    ranks = [{"resume_verified": {8: True}} for _ in range(4)]
    assert unchecked_report(config, ranks, started, True, tmp_path / "run.json", "en") == 0
    english = capsys.readouterr().out.splitlines()
    assert english == ["resume check not run (--no-check): no second run was trained and nothing "
                       "was compared with one; the checkpoints of steps 8 reload byte for byte on "
                       "all 4 ranks: True",
                       "RESUME NOT CHECKED (--no-check): the run trained to step 8 on 4 ranks, no "
                       "run from another start was compared with it"]
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["checked"] is False and summary["verified"] is None and summary["reloaded"]
    ranks[2] = {"resume_verified": {8: False}}
    assert unchecked_report(config, ranks, started, True, tmp_path / "run.json", "fa") == 1
    persian = capsys.readouterr().out
    assert "روی هر ۴ رتبه بایت‌به‌بایت بازیابی می‌شوند: خیر" in persian and "True" not in persian
    assert persian.splitlines()[-1].startswith("RESUME NOT CHECKED (--no-check): اجرا روی ۴ رتبه تا گام ۸")


def test_the_manifest_summary_writes_persian_numbers_and_english_as_before(tmp_path):
    folder = tmp_path / "step-00000010"
    folder.mkdir()
    shard = write_file(folder, "shard-00001-of-00004.pt", {"master": torch.zeros(7520)})
    shard["layout"] = {"numel": 30080, "start": 7520, "length": 7520, "padding": 0}
    weights = write_file(folder, "replicated.pt", {"w": torch.zeros(3)})
    weights["layout"] = {}
    write_manifest(folder, {"format_version": files.FORMAT_VERSION, "step": 10, "world_size": 4,
                            "files": [shard, weights]})
    english = manifest_summary(folder).splitlines()
    assert english[0] == (f"checkpoint {folder}: step 10, world size 4, format "
                          f"{files.FORMAT_VERSION}, manifest sha256 verified")
    assert english[1] == (f"  shard-00001-of-00004.pt    {shard['bytes']:7d} B  sha256 "
                          f"{shard['sha256'][:16]}… elements 7520..15039")
    assert english[2].endswith("… (replicated)")
    persian = manifest_summary(folder, "fa").splitlines()
    assert persian[0].startswith("چکپوینت گام ۱۰ با ۴ رتبه") and "چکیدهٔ sha256 مانیفست وارسی شد" in persian[0]
    # A right-to-left line: an LRM before the path keeps its leading "/" (or "...") at its left end.
    assert persian[0].endswith(f": \u200e{folder}")
    assert "عنصرهای ۷۵۲۰ تا ۱۵۰۳۹" in persian[1]
    grouped = format(shard["bytes"], ",").translate(str.maketrans("0123456789,", "۰۱۲۳۴۵۶۷۸۹٬"))
    assert shard["bytes"] >= 1000 and grouped + " بایت" in persian[1]  # thousands grouped, as the prose writes them
    numbers_outside_names = re.sub(r"shard-\d+-of-\d+\.pt|sha256 [0-9a-f]+…|sha256|" + re.escape(str(folder)),
                                   "", "\n".join(persian))
    assert not re.search(r"[0-9]", numbers_outside_names), numbers_outside_names


def test_the_command_reads_its_language_and_fresh(tmp_path):
    out = ["--out-dir", str(tmp_path)]
    assert parse_arguments(["--lang", "fa", *out])[1:] == ("fa", False, True)
    assert parse_arguments([*out, "--fresh"])[1:] == ("en", True, True)
    assert parse_arguments([*out, "--no-check"])[1:] == ("en", False, False)
    config = parse_arguments([*out, "--kill-at-step", "10", "--kill-during-save"])[0]
    assert (config.kill_at_step, config.victim(), config.kill_during_save) == (10, 3, True)


STARTED = {"from_step": 8, "folder": "run/checkpoints/step-00000008", "restarts": 1,
           "skipped": [".step-00000012.tmp: an interrupted save, never published"]}


def test_the_report_says_where_the_run_started_in_both_languages():
    root = Path("run/checkpoints")
    fresh = {"from_step": None, "folder": None, "skipped": [], "restarts": 0}
    assert start_line(fresh, root, fresh=False, steps=20) == \
        "started fresh at step 0: no checkpoint to continue from in run/checkpoints"
    assert "(--fresh deleted the checkpoints there first)" in start_line(fresh, root, True, 20)
    english = start_line(STARTED, root, fresh=True, steps=20).splitlines()
    assert english == [
        "resumed from step 8: run/checkpoints/step-00000008, the newest checkpoint that verifies "
        "(--fresh starts a run on its first attempt only: a restart continues it); torchrun has "
        "restarted the ranks 1 time(s) (TORCHELASTIC_RESTART_COUNT)",
        "  skipped .step-00000012.tmp: an interrupted save, never published"]
    persian = start_line(STARTED, root, fresh=False, steps=20, lang="fa").splitlines()
    assert persian[0].startswith("اجرا از گام ۸ ادامه یافت: run/checkpoints/step-00000008")
    assert "۱ بار دوباره راه انداخته است" in persian[0] and len(persian) == 2
    done = {**STARTED, "from_step": 20, "restarts": 0}
    assert "the run had finished: nothing left to train" in start_line(done, root, False, 20)


def test_under_torchrun_an_argument_error_is_printed_once(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    printed = []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(SystemExit) as caught:
            parse_arguments(["--kill-at-step", "3", "--kill-rank", "4"])
        assert caught.value.code == 2  # every rank stops
        printed.append(capsys.readouterr().err)
    assert all(err == "" for err in printed[1:]), printed
    error = printed[0].splitlines()[-1]
    assert error == ("python -m lesson_code.capstone: error: --kill-rank 4 is outside 0..3: the run "
                     "has 4 ranks (torchrun's WORLD_SIZE, set by torchrun's --nnodes x "
                     "--nproc-per-node), so pass a value from 0 to 3")


def test_metrics_are_logged_as_the_run_goes_and_a_line_cut_by_a_kill_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    row = {"step": 1, "loss": 4.0, "grad_norm": 0.5, "step_time_s": 0.01, "lr": 1e-3, "param_norm": 5.0}
    log = MetricsLog(path, {"records": [row], "events": []})  # a continued run's history
    log.write({**row, "step": 2})
    log.write({"event": "rollback", "to_step": 1})
    assert [r.get("step", r.get("event")) for r in read_metrics(path)] == [1, 2, "rollback"]
    with open(path, "a") as handle:
        handle.write('{"step": 3, "lo')  # what a process killed while writing leaves
    assert len(read_metrics(path)) == 3
    path.write_text(path.read_text().replace('{"step": 2', '{"step": 2,,'))
    with pytest.raises(ValueError, match="metrics.jsonl, line 2: not a JSON object"):
        read_metrics(path)
    MetricsLog(None, {"records": [row], "events": []}).write(row)  # other ranks write nothing


def test_the_crash_summary_has_a_persian_label_for_every_number():
    result = CrashAndResume(killed=[], continued=[], uninterrupted=[], crash_step=10, resume_step=8,
                            restarted_steps=2, seconds={"killed": 7.91, "continued": 9.0,
                                                        "uninterrupted": 4.7},
                            same_losses=True, same_checkpoint=False, report="")
    summary = result.summary()
    assert summary["steps trained twice"] == 2 and summary["same last checkpoint"] is False
    assert set(summary) <= set(TABLE_WORDS["fa"])


def test_the_command_warns_when_torchrun_restarts_several_nodes_that_share_a_store(monkeypatch):
    nodes = {"RANK": "0", "WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2",
             "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for key, value in nodes.items():
        monkeypatch.setenv(key, value)
    assert restarts_share_a_store()
    for key, value in (("TORCHELASTIC_USE_AGENT_STORE", "False"), ("GROUP_WORLD_SIZE", "1"),
                       ("TORCHELASTIC_MAX_RESTARTS", "0")):
        monkeypatch.setenv(key, value)
        assert not restarts_share_a_store()
        monkeypatch.setenv(key, nodes[key])


def test_the_persian_second_resume_check_names_the_run_it_judges():
    # The line opens with the run ("a run that continued from step 10 ...") and ends with its
    # verb, "is equal", so that it reads as a sentence, not as a list of facts with no subject.
    from lesson_code.capstone.cli import WORDS
    for key in ("check_2", "check_2_continued"):
        said = WORDS["fa"][key].split(": ", 1)[1]
        assert said.startswith(("اجرایی که", "این اجرا")), key
        assert said.endswith("برابر است:"), key


def test_verify_resume_keeps_the_gpu_generator_of_its_device_aside(monkeypatch):
    """Under NCCL the fresh build inside verify_resume re-seeds the GPU's generator too: the
    check forks both generators around it, so training draws the same numbers as without it.
    The CPU here stands in for a GPU rank: the fork is asked for the rank's CUDA device."""
    from lesson_code.capstone import train

    forked = []

    class Forked(Exception):
        pass

    def fork_rng(devices, **_):
        forked.append(list(devices))
        raise Forked  # stop before anything is built on a device this machine lacks

    monkeypatch.setattr(train, "current_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)
    with pytest.raises(Forked):
        train.verify_resume(CapstoneConfig(), "unused", {}, rank=0, world_size=1)
    assert forked == [[torch.device("cuda", 0)]]
