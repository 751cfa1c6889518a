"""Capstone pieces that need no ranks: the corpus, batches, the guard, the config, the report."""

import dataclasses
import math

import pytest
import torch

from lesson_code.capstone import CapstoneConfig, make_corpus
from lesson_code.data import batch_for_step
from lesson_code.experiment import RunConfig
from lesson_code.capstone.guard import DivergenceGuard
from lesson_code.capstone.cli import parse_arguments, resume_report
from lesson_code.capstone.report import loss_table, read_metrics, reason_text, write_metrics


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


def test_the_config_is_a_run_whose_global_batch_is_derived_from_the_ranks():
    config = CapstoneConfig()
    assert isinstance(config, RunConfig) and config.model == "gpt"
    assert (config.steps, config.seed, config.comm) == (20, 0, "ring")
    assert config.batch_size == config.world_size * config.batch_per_rank == 16
    two = dataclasses.replace(config, world_size=2)
    assert two.batch_size == 8  # derived again, never copied
    with pytest.raises(TypeError):
        CapstoneConfig(model="mlp")  # the capstone trains MiniGPT only
    with pytest.raises(TypeError):
        CapstoneConfig(batch_size=32)  # set world_size or batch_per_rank instead
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
    report = resume_report(CapstoneConfig(), 4, True, resumed, "fa")
    assert "گام‌ها و زیان‌ها: True" in report and "وضعیت مولد اعداد تصادفی: False" in report
    assert report.count(": True") == 3 and "resume check" not in report
    assert resume_report(CapstoneConfig(), 4, True, resumed).startswith("resume check 1: step-10 ")
    assert parse_arguments(["--lang", "fa"])[1] == "fa" and parse_arguments([])[1] == "en"
