"""Lesson 77's model of a bucketed backward pass (ddp_lab.overlap_model, backward_work,
bucket_sweep, ModelledCluster, communication_ratio): arithmetic only, checked against what each
piece says it computes."""

from dataclasses import replace

import pytest

from lesson_code import ddp_exercises, ddp_lab
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
        model = ddp_lab.overlap_model(inputs["sizes"], row["bucket MiB"], inputs["backward_s"],
                                      inputs["alpha"], inputs["beta"], inputs["world_size"])
        assert row["buckets"] == len(model["buckets"])
        assert row["exposed comm, model (ms)"] == 1e3 * model["exposed_s"]
        assert row["backward + exposed, model (ms)"] == pytest.approx(
            1e3 * (inputs["backward_s"] + model["exposed_s"]), rel=1e-12)


def test_a_gradient_is_ready_once_the_work_before_it_is_done():
    """An embedding's gradient (a scatter-add, no matmul) made last adds almost no time: it is
    ready at the end of the backward, right after the matrix before it, not a share of the
    backward proportional to its bytes later."""
    sizes, work = [4 * 2 ** 20, 4 * 2 ** 20], [3.0, 0.0]  # a matrix, then an embedding as large
    model = ddp_lab.overlap_model(sizes, 4, 0.1, 1e-5, 1e-9, 4, work)
    assert [bucket["ready"] for bucket in model["buckets"]] == pytest.approx([0.1, 0.1], rel=1e-12)
    by_bytes = ddp_lab.overlap_model(sizes, 4, 0.1, 1e-5, 1e-9, 4)
    assert [bucket["ready"] for bucket in by_bytes["buckets"]] == pytest.approx([0.05, 0.1], rel=1e-12)


def test_backward_work_counts_matmuls_and_not_an_embeddings_rows():
    config = GPTConfig(vocab_size=1000, context=16, n_layer=2, n_embd=32, n_head=4)
    sequences, tokens, C, T = 3, 3 * 16, 32, 16
    work = dict(zip(reversed([name for name, _ in MiniGPT(config).named_parameters()]),
                    ddp_lab.backward_work(config, sequences)))
    assert list(work)[0] == "head.lm_head.weight" and list(work)[-1] == "embed.tokens.weight"
    assert work["head.lm_head.weight"] == 4 * 1000 * C * tokens  # a matmul: 4 x its weights
    assert work["embed.tokens.weight"] == tokens * C  # a scatter-add: one addition per element
    assert work["blocks.0.mlp.0.weight"] == 4 * 4 * C * C * tokens
    assert work["blocks.0.attn.qkv.weight"] == 4 * 3 * C * C * tokens + 8 * T * C * tokens
    assert work["blocks.0.attn.qkv.bias"] == 3 * C * tokens  # a sum over tokens
    without = dict(zip(work, ddp_lab.backward_work(config, sequences, attention=False)))
    assert without["blocks.0.attn.qkv.weight"] == 4 * 3 * C * C * tokens  # the weights' alone
    assert {name: work[name] - without[name] for name in work if work[name] != without[name]} == {
        f"blocks.{layer}.attn.qkv.weight": 8 * T * C * tokens for layer in range(2)}


def test_the_modelled_cluster_derives_its_inputs_from_its_constants():
    cluster = ddp_lab.ModelledCluster()
    inputs = cluster.inputs()
    tokens = cluster.sequences * cluster.gpt.context
    assert sum(inputs["sizes"]) == 4 * gpt_parameters(cluster.gpt)  # float32 gradients
    assert inputs["work"] == ddp_lab.backward_work(cluster.gpt, cluster.sequences)
    assert inputs["backward_s"] == pytest.approx(sum(inputs["work"]) / cluster.flops_per_s,
                                                 rel=1e-12)
    V, C, T, L = (cluster.gpt.vocab_size, cluster.gpt.n_embd, cluster.gpt.context,
                  cluster.gpt.n_layer)
    matrices = V * C + L * 12 * C * C  # the head and the blocks' weights; embeddings are not
    assert inputs["backward_s"] == pytest.approx(
        (4 * matrices * tokens + L * 8 * T * C * tokens) / cluster.flops_per_s, rel=1e-3)
    assert (inputs["alpha"], inputs["beta"], inputs["world_size"]) == (15e-6, 1 / 25e9, 4)
    slower = replace(cluster, alpha_s=150e-6, bandwidth=12.5e9).inputs()
    assert (slower["alpha"], slower["beta"]) == (150e-6, 1 / 12.5e9)


def test_above_a_ratio_of_one_no_bucket_size_hides_all_the_communication():
    for sequences in (4, 8, 16, 32):
        inputs = replace(ddp_lab.ModelledCluster(), sequences=sequences).inputs()
        ratio = ddp_lab.communication_ratio(inputs)
        whole = cost_model.predict("all_reduce", sum(inputs["sizes"]), inputs["world_size"],
                                   inputs["alpha"], inputs["beta"])
        assert ratio == pytest.approx(whole / inputs["backward_s"], rel=1e-12)
        for row in ddp_lab.bucket_sweep(inputs, [0.25, 4, 25, 100, 1024]):
            exposed = row["exposed comm, model (ms)"] / 1e3
            assert exposed >= (ratio - 1) * inputs["backward_s"] - 1e-12
    assert ddp_lab.communication_ratio(ddp_lab.ModelledCluster().inputs()) > 1  # 8 sequences


def test_bucket_counts_by_our_rule_and_by_pytorchs():
    """Five gradients of 1200 bytes under a 2000-byte cap: ours never goes over the cap (five
    buckets of one each); PyTorch's closes a bucket once it reaches the cap ([0, 1], [2, 3], [4])."""
    (row,) = ddp_exercises.bucket_counts([1200] * 5, [2000 / 2 ** 20])
    assert row["buckets, our rule"] == 5 and row["buckets, PyTorch's rule"] == 3
