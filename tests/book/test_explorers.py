"""The lessons' offline explorers (book/static/explorer-*.js) compute what lesson_code computes.

Each explorer's pure functions run under node (or headless Chromium) on a grid of inputs and
must give the package's numbers: the same schedules and timelines exactly (they are integers
and sums of small integers), the same fractions to the last bit a float64 allows.
"""

from __future__ import annotations

import re

import pytest

from javascript import STATIC, evaluate
from lesson_code import pipeline

PIPELINE_GRID = [(schedule, p, m) for schedule in pipeline.SCHEDULES for p in range(1, 9)
                 for m in range(1, 17)]


def test_the_schedule_explorer_draws_pipeline_ideal_timeline():
    got = evaluate(["explorer-common.js", "explorer-79.js"], """(grid) => grid.map(([s, p, m]) => {
        const E = globalThis.Explorer79;
        const events = E.timeline(s, p, m);
        return {orders: [...Array(p).keys()].map((stage) => E.order(s, stage, p, m)),
                events, bubble: E.bubble(events, p), formula: E.theoretical(p, m),
                peaks: [...Array(p).keys()].map((stage) => E.peak(E.order(s, stage, p, m)))};
    })""", PIPELINE_GRID)
    for (schedule, p, m), js in zip(PIPELINE_GRID, got, strict=True):
        orders = [pipeline.schedule_order(schedule, stage, p, m) for stage in range(p)]
        events = pipeline.ideal_timeline(schedule, p, m)
        assert js["orders"] == [[list(step) for step in order] for order in orders]
        assert js["events"] == [list(event) for event in events], (schedule, p, m)
        assert js["bubble"] == pytest.approx(pipeline.bubble_fraction(events, p), abs=1e-15)
        assert js["formula"] == pytest.approx(pipeline.theoretical_bubble(p, m), rel=1e-15)
        assert js["peaks"] == [pipeline.peak_in_flight(order) for order in orders]


def test_the_ideal_timeline_has_the_formula_bubble_and_1f1b_holds_fewer_micro_batches():
    for p, m in [(2, 1), (4, 8), (8, 16)]:
        for schedule in pipeline.SCHEDULES:
            events = pipeline.ideal_timeline(schedule, p, m)
            assert pipeline.bubble_fraction(events, p) == pytest.approx(
                pipeline.theoretical_bubble(p, m), rel=1e-12)
        held = [pipeline.peak_in_flight(pipeline.schedule_order("1f1b", s, p, m)) for s in range(p)]
        assert held == [min(p - s, m) for s in range(p)]
        assert all(pipeline.peak_in_flight(pipeline.schedule_order("gpipe", s, p, m)) == m
                   for s in range(p))


RING_SIZES = [0, 1, 1000, 2 ** 10, 3 * 2 ** 17, 2 ** 20, 2 ** 26, 2 ** 40]


def caption_chunk(formula: str, r: int, k: int, n: int) -> int:
    """The chunk an explorer caption's formula, such as "(r − k + 1) mod N", names for rank r."""
    match = re.fullmatch(r"\(r − k(?: ([+−]) (\d+))?\) mod N", formula)
    assert match, formula
    sign, offset = match.groups()
    return (r - k + (int(offset) if sign == "+" else -int(offset) if sign else 0)) % n


def test_the_ring_explorer_steps_and_costs_as_lesson_code_does():
    from lesson_code.book_build import explorer_data
    from lesson_code.collectives import choose, cost_model, ring_chunk_indices
    from lesson_code.plots.collectives import ring_states

    data = explorer_data.collectives()
    worlds = list(range(1, 17))
    got = evaluate(["explorer-common.js", "explorer-76.js"], """([data, worlds, sizes]) => {
        const E = globalThis.Explorer76;
        return worlds.map((n) => ({
            chunks: ["reduce_scatter", "all_gather"].map((phase) => [...Array(n).keys()].map((r) =>
                [...Array(Math.max(n - 1, 0)).keys()].map((s) => E.chunks(phase, r, s, n)))),
            states: E.states(n),
            captions: E.states(n).map((frame) => E.caption(frame, n)),
            costs: Object.values(data.models).map((model) => sizes.map((b) => [
                E.messages(model, n), E.bytesPerRank(model, b, n), E.predict(model, b, n, 1e-4, 1e-9)])),
            auto: n >= 2 ? sizes.map((b) => E.chooses(data.decisions[String(n)], b)) : null}));
    }""", [data, worlds, RING_SIZES])
    costs = choose.stored_costs(choose.STORED)
    for n, js in zip(worlds, got, strict=True):
        assert js["chunks"] == [[[list(ring_chunk_indices(phase, r, s + 1, n)) for s in range(n - 1)]
                                 for r in range(n)] for phase in ("reduce_scatter", "all_gather")]
        frames = ring_states(n)
        assert [(f["phase"], f["step"]) for f in js["states"]] == [(p, s) for p, s, _, _ in frames]
        for frame, (_, _, state, sent) in zip(js["states"], frames):
            assert frame["state"] == [[sorted(held) for held in row] for row in state]
            assert {tuple(pair) for pair in frame["sent"]} == sent
        for frame, words in zip(js["states"], js["captions"], strict=True):
            # the caption's formula, at the step it shows, names the chunk the frame outlines
            assert words["k"] == frame["step"] + 1 and words["t"] == n - 1
            assert [caption_chunk(words["f"], r, words["k"], n) for r in range(n)] == [
                ring_chunk_indices(frame["phase"], r, frame["step"] + 1, n)[0] for r in range(n)] == [
                chunk for _, chunk in sorted(frame["sent"])]
        for model, rows in zip(data["models"].values(), js["costs"], strict=True):
            for nbytes, (messages, per_rank, seconds) in zip(RING_SIZES, rows):
                assert messages == cost_model.message_count(model, n)
                assert per_rank == pytest.approx(cost_model.bytes_per_rank(model, nbytes, n), rel=1e-15)
                assert seconds == pytest.approx(cost_model.predict(model, nbytes, n, 1e-4, 1e-9),
                                                rel=1e-15)
        if n >= 2:
            assert js["auto"] == [costs.decisions(n).choose(nbytes) for nbytes in RING_SIZES]
    # one alpha and beta for every algorithm, the lesson's modelled cluster's, not the stored fits
    assert data["cluster"] == [cost_model.CLUSTER.alpha, cost_model.CLUSTER.beta] == [5e-6, 1 / 25e9]
    assert set(data["models"]) == set(costs.fits)


def test_the_crash_explorer_shows_the_states_a_real_save_passes_through(tmp_path):
    from lesson_code import launch
    from lesson_code.checkpoint.faults import states_of_a_save
    from lesson_code.checkpoint.tools import latest_checkpoint

    states = launch.spawn(states_of_a_save, str(tmp_path / "run"), str(tmp_path / "copies"),
                          world_size=1)[0]
    got = evaluate(["explorer-common.js", "explorer-80.js"], """(count) => {
        const E = globalThis.Explorer80;
        return {events: E.events(1).length,
                states: [...Array(count).keys()].map((k) => E.stateAfter(1, k)),
                latest: [...Array(count).keys()].map((k) => E.latestAfter(1, k)),
                three: [...Array(E.events(3).length + 1).keys()].map((k) => E.stateAfter(3, k))};
    }""", len(states))
    assert got["events"] == len(states) - 1  # one event per change of the folder
    assert got["states"] == states
    for k, js in enumerate(got["latest"]):
        folder, skipped = latest_checkpoint(tmp_path / "copies" / str(k))
        assert js["folder"] == folder.name, k
        assert js["publishes"] == (".step-00000002.tmp/" in states[k] and folder.name == "step-00000002")
        reason = {None: [], "interrupted": ["an interrupted save, never published"],
                  "checksum": ["an interrupted save, never published"]}[js["skipped"]]
        assert len(skipped) == len(reason) and all(r in s for r, s in zip(reason, skipped)), k
    # Three ranks: each event adds or removes exactly the file it names, and the end is whole.
    three = got["three"]
    assert all(len(set(a) ^ set(b)) >= 1 for a, b in zip(three, three[1:]))
    assert [p for p in three[-1] if p.startswith("step-00000002/shard")] == [
        f"step-00000002/shard-0000{r}-of-00003.pt" for r in range(3)]


def test_the_capstone_explorer_counts_parameters_and_bytes_as_lesson_code_does():
    from lesson_code import memory
    from lesson_code.book_build import explorer_data
    from lesson_code.bench import capstone as capstone_bench
    from lesson_code.models import GPTConfig, MiniGPT, count_parameters, gpt_parameters

    shapes = [{"vocab_size": 64, "context": 16, "n_layer": layers, "n_embd": width}
              for layers in (1, 2, 5, 24) for width in (32, 64, 768, 2048)]
    worlds = [1, 2, 3, 4, 7, 16]
    got = evaluate(["explorer-common.js", "explorer-81.js"], """([shapes, worlds]) => {
        const E = globalThis.Explorer81;
        return shapes.map((shape) => { const p = E.parameters(shape);
            return {p, zero: worlds.map((n) => E.capstoneBytes(p, n)), ddp: E.ddpBytes(p),
                    ddpMaster: E.ddpMasterBytes(p)}; });
    }""", [shapes, worlds])
    for shape, js in zip(shapes, got, strict=True):
        config = GPTConfig(**shape)
        assert js["p"] == gpt_parameters(config)
        assert js["zero"] == [memory.capstone_bytes(js["p"], n) for n in worlds]
        ddp = memory.bytes_per_rank("DDP", js["p"], 4, memory.FP32_ADAM)
        assert js["ddp"] == {"parameters": ddp["params"], "gradients": ddp["grads"],
                             "optimizer": ddp["optimizer"]}
        master = memory.bytes_per_rank("DDP", js["p"], 4, memory.FP32_MASTER_ADAM)
        assert js["ddpMaster"] == {"parameters": master["params"], "gradients": master["grads"],
                                   "optimizer": master["optimizer"]}
    for shape in shapes[:6]:  # small enough to build: the formula counts the real model
        assert gpt_parameters(GPTConfig(**shape)) == count_parameters(MiniGPT(GPTConfig(**shape)))
    data = explorer_data.capstone()
    assert data["curve"] == capstone_bench.read_curve()[1]
    rollbacks = [row for row in data["curve"] if row.get("event") == "rollback"]
    assert [(r["to_step"], r["at_step"]) for r in rollbacks] == [(10, capstone_bench.SPIKE_STEP + 1)]


def test_the_overlap_explorer_buckets_and_times_as_ddp_lab_does():
    from lesson_code import ddp_lab
    from lesson_code.book_build import explorer_data
    from lesson_code.ddp import bucket_groups

    data = explorer_data.ddp()
    settings = {"here": data, "cluster": data["cluster"]}
    # (setting, sizes, work, bucket MiB): the real gradients with the backward's work before
    # each, and made-up sizes without it (ready in proportion to the bytes so far).
    cases = [(setting, sizes, work, mb) for setting in settings
             for sizes, work in ((settings[setting]["sizes"], settings[setting]["work"]),
                                 ([4, 4, 4], None), ([10 ** 6] * 9, None), ([3 * 2 ** 20, 1], None),
                                 ([3 * 2 ** 20, 1], [0.0, 5.0]))
             for mb in (0.25, 1, 4, 25, 32, 1024, 1e-6)]
    got = evaluate(["explorer-common.js", "explorer-77.js"], """([cases, settings]) => cases.map(([setting, sizes, work, mb]) => {
        const d = settings[setting];
        return {groups: globalThis.Explorer77.groups(sizes, Math.trunc(mb * 2 ** 20)),
                model: globalThis.Explorer77.overlap(sizes, work, mb, d.backward_s, d.alpha, d.beta, d.world_size),
                ratio: globalThis.Explorer77.ratio(sizes, d.backward_s, d.alpha, d.beta, d.world_size)};
    })""", [cases, settings])
    for (setting, sizes, work, mb), js in zip(cases, got, strict=True):
        assert js["groups"] == bucket_groups(sizes, int(mb * 2 ** 20))
        d = settings[setting]
        python = ddp_lab.overlap_model(sizes, mb, d["backward_s"], d["alpha"], d["beta"],
                                       d["world_size"], work)
        assert js["ratio"] == pytest.approx(ddp_lab.communication_ratio({**d, "sizes": sizes}),
                                            rel=1e-12)
        assert js["model"]["exposed_s"] == pytest.approx(python["exposed_s"], rel=1e-12, abs=1e-15)
        for ours, theirs in zip(js["model"]["buckets"], python["buckets"], strict=True):
            assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)
    # The wrapper cuts the real model's buckets the same way.
    from lesson_code.bench import ddp as ddp_bench
    from lesson_code.ddp import make_buckets
    from lesson_code.models import MiniGPT

    params = list(reversed(list(MiniGPT(ddp_bench.BENCH_GPT).parameters())))
    assert [len(b.params) for b in make_buckets(params, 4 * 2 ** 20)] == [
        len(group) for group in bucket_groups(data["sizes"], 4 * 2 ** 20)]
    assert set(data["measured_wait_ms"]) == set(data["measured_step_ms"]) == {"0.25", "4", "32"}


def test_the_overlap_explorer_takes_the_backward_that_ran_alone():
    """The model's backward is the one of the benchmark's one-bucket row, whose single all-reduce
    starts when the backward has ended: the only backward timed with no communication beside it
    (torch DDP's, which the explorer once took, includes the all-reduces it waits for)."""
    from lesson_code import ddp_lab
    from lesson_code.bench import stored
    from lesson_code.book_build import explorer_data

    data = explorer_data.ddp()
    table, _ = stored.load("ddp")
    ours = table[(table["wrapper"] == "bucketed") & (table["comm"] == "ring")]
    one_bucket = ours.loc[ours["bucket_mb"].idxmax()]
    assert one_bucket["bucket_mb"] * 2 ** 20 >= sum(data["sizes"])
    assert data["backward_s"] == one_bucket["backward_ms"] / 1e3
    assert data["measured_step_ms"]["32"] == one_bucket["step_ms"]
    assert data["cluster"] == ddp_lab.ModelledCluster().inputs()


def test_every_lesson_page_loads_small_offline_explorers():
    from lesson_code.book_build import pages

    notebooks = {path.stem for path in (STATIC.parents[1] / "notebooks" / "en").glob("*.ipynb")}
    lessons = {name for name in notebooks if re.match(r"\d+-", name)}
    # every numbered lesson has explorers; an optional page of a lesson (76a-...) may have none
    assert lessons <= set(pages.EXPLORERS) <= notebooks
    for scripts in pages.EXPLORERS.values():
        for name in scripts:
            source = (STATIC / name).read_text(encoding="utf-8")
            assert len(source.encode()) < 30_000, name
            assert "http://" not in source.replace("http://www.w3.org/2000/svg", "")
            assert "https://" not in source and "fetch(" not in source, name
