"""Lesson 77's model of a bucketed backward pass (ddp_lab.overlap_model, bucket_sweep,
ModelledCluster): arithmetic only, checked against what each piece says it computes."""

from dataclasses import replace

import pytest

from lesson_code import ddp_lab
from lesson_code.collectives import cost_model
from lesson_code.models import GPTConfig, MiniGPT, gpt_parameters


def test_gradient_sizes_are_the_models_in_the_order_backward_makes_them():
    config = GPTConfig(vocab_size=50, context=8, n_layer=2, n_embd=16, n_head=2)
    built = [p.numel() * p.element_size() for p in reversed(list(MiniGPT(config).parameters()))]
    assert ddp_lab.gradient_sizes(config) == built


def test_one_bucket_exposes_its_whole_all_reduce_and_small_buckets_hide_all_but_the_last():
    sizes, backward, alpha, beta, ranks = [2 ** 20] * 8, 0.1, 1e-4, 1e-9, 4
    one = ddp_lab.overlap_model(sizes, 1024, backward, alpha, beta, ranks)
    whole = cost_model.predict("all_reduce", sum(sizes), ranks, alpha, beta)
    assert len(one["buckets"]) == 1 and one["exposed_s"] == pytest.approx(whole, rel=1e-12)
    each = ddp_lab.overlap_model(sizes, 1, backward, alpha, beta, ranks)
    last = cost_model.predict("all_reduce", sizes[-1], ranks, alpha, beta)
    assert len(each["buckets"]) == 8 and each["exposed_s"] == pytest.approx(last, rel=1e-12)


def test_the_sweep_reports_the_model_at_each_size():
    inputs = {"sizes": [3 * 2 ** 20, 2 ** 20, 5 * 2 ** 20], "backward_s": 0.05, "alpha": 2e-5,
              "beta": 4e-10, "world_size": 8}
    for row in ddp_lab.bucket_sweep(inputs, [0.5, 4, 64]):
        model = ddp_lab.overlap_model(inputs["sizes"], row["bucket MB"], inputs["backward_s"],
                                      inputs["alpha"], inputs["beta"], inputs["world_size"])
        assert row["buckets"] == len(model["buckets"])
        assert row["exposed comm, model (ms)"] == 1e3 * model["exposed_s"]
        assert row["backward + exposed, model (ms)"] == pytest.approx(
            1e3 * (inputs["backward_s"] + model["exposed_s"]), rel=1e-12)


def test_the_modelled_cluster_derives_its_inputs_from_its_constants():
    cluster = ddp_lab.ModelledCluster()
    inputs = cluster.inputs()
    tokens = cluster.sequences * cluster.gpt.context
    assert sum(inputs["sizes"]) == 4 * gpt_parameters(cluster.gpt)  # float32 gradients
    assert inputs["backward_s"] == pytest.approx(
        4 * gpt_parameters(cluster.gpt) * tokens / cluster.flops_per_s, rel=1e-12)
    assert (inputs["alpha"], inputs["beta"], inputs["world_size"]) == (5e-6, 1 / 25e9, 4)
    slower = replace(cluster, alpha_s=50e-6, bandwidth=12.5e9).inputs()
    assert (slower["alpha"], slower["beta"]) == (50e-6, 1 / 12.5e9)
