"""Lesson 78's scale lab: the course's DDP and ZeRO on simulated ranks, measured, against the
formulas of `lesson_code.memory` and the ZeRO paper's table.

The check that matters is `scale_lab.mismatches`: what a rank holds of what the formulas count
must equal the formula over the rank's real (padded) shard, part by part. It must hold for the
course's optimizers at every world size, and fail for one that keeps more than its stage
shards (test_a_stage_one_optimizer_that_keeps_the_full_state_is_caught).
"""

import json
from dataclasses import replace

import pytest
import torch

from lesson_code import language, memory, scale_lab, zero_lab
from lesson_code.models import GPTConfig
from lesson_code.plots import scale
from lesson_code.scale_lab import ScaleRun, faults, pipelined, report, stored
from lesson_code.scale_lab import __main__ as scale_lab_command
from lesson_code.zero import ZeroOptimizer, flatten_params

TINY = ScaleRun(gpt=GPTConfig(vocab_size=64, context=16, n_layer=2, n_embd=32, n_head=4))
TINY_PARAMETERS = 30_080  # 0 mod 4 and mod 64, 1 mod 7, 0 mod 128


@pytest.fixture(scope="module")
def tiny_sweep():
    return scale_lab.sweep(TINY, world_sizes=(1, 3, 4, 7, 128), ranks="ends")


def test_what_every_rank_holds_is_the_formula_over_its_shard(tiny_sweep):
    assert TINY.parameters == TINY_PARAMETERS
    assert scale_lab.mismatches(tiny_sweep).empty
    assert set(tiny_sweep.N) == {1, 3, 4, 7, 128} and set(tiny_sweep["rank"]) >= {0, 6, 127}
    # Where N divides every flat vector there is no padding, and the formula holds exactly.
    exact = tiny_sweep[tiny_sweep.N.isin([1, 4])]
    assert (exact.counted == exact.formula).all() and (exact.padding == 0).all()
    # Padding is the last rank's: rank 6 of 7 holds the 6 zeros that make ZeRO-1's flat
    # vector of 30,080 elements a multiple of 7.
    padded = tiny_sweep.set_index(["N", "strategy", "rank"])
    assert padded.loc[(7, "ZeRO-1", 6), "padding"] == 6 and padded.loc[(7, "ZeRO-1", 0), "padding"] == 0


def test_what_the_formulas_leave_out_is_measured_and_explained(tiny_sweep):
    rows = tiny_sweep.set_index(["N", "strategy", "rank"])
    weights = 2 * TINY_PARAMETERS  # bf16
    ddp = rows.loc[(4, "DDP", 0)]
    assert ddp.gradients == 2 * weights  # each .grad and its copy in DDP's bucket
    zero1 = rows.loc[(4, "ZeRO-1", 0)]
    assert zero1.gradients == weights + weights // 4  # the whole .grad and the averaged shard
    assert (rows.buffers == 2 * 16 * 16).all()  # two causal masks of 16 x 16 bools
    assert (rows.peak >= rows.model_states + rows.buffers).all()


def test_bytes_sent_are_the_rings_whatever_n(tiny_sweep):
    """ZeRO's rings move padded vectors, N shards long: per step a rank sends N - 1 shards (bf16)
    in each reduce-scatter and all-gather, 2 of them under ZeRO-1 and 2, 3 under ZeRO-3: the
    formula's 2 (N-1)/N Psi and 3 (N-1)/N Psi over the padded length. DDP's ring splits the
    unpadded gradient, so a chunk may be one element longer or shorter than Psi/N: 2 (N - 1)
    chunks sent, each within 2 bytes of the formula's."""
    volume = {"ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3}
    for row in tiny_sweep.itertuples():
        if row.strategy == "DDP":
            assert abs(row.sent - row.formula_sent) <= 2 * (row.N - 1) * 2, row
        else:
            assert row.sent == volume[row.strategy] * (row.N - 1) * row.shard_numel * 2, row
    exact = tiny_sweep[tiny_sweep.N.isin([1, 4])]  # no padding: the formula itself
    assert (exact.sent == exact.formula_sent).all()


def test_a_stage_one_optimizer_that_keeps_the_full_state_is_caught():
    with faults.in_place_of_zero1(faults.SlicedStateZero):
        table = scale_lab.sweep(TINY, world_sizes=(1, 4), strategies=("ZeRO-1", "ZeRO-2"))
    assert zero_lab.ZeroOptimizer is ZeroOptimizer  # the course's own again afterwards
    caught = scale_lab.mismatches(table)
    assert list(zip(caught.N, caught.strategy)) == [(4, "ZeRO-1")]  # N = 1: the same bytes
    row = caught.iloc[0]
    assert row.optimizer == 12 * TINY_PARAMETERS and row.counted - row.expected == 9 * TINY_PARAMETERS
    # The one-line detector the page names: a state tensor's storage is its own size.
    from lesson_code.models import MiniGPT
    from lesson_code.runtime import simulated

    def own_size(tensor):
        return tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()

    with simulated.fake_rank(4, 3), torch.device("meta"):
        for optimizer_class, expected in ((ZeroOptimizer, True), (faults.SlicedStateZero, False)):
            optimizer = optimizer_class(MiniGPT(TINY.gpt), 4, 3, lr=1e-3)
            state = (optimizer.master, optimizer.exp_avg, optimizer.exp_avg_sq)
            assert [own_size(tensor) for tensor in state] == [expected] * 3, optimizer_class


class TwicePaddedZero(ZeroOptimizer):
    """ZeRO-1 whose shard is twice ceil(Psi / N) elements, the second half padding: it trains as
    ZeRO-1 does, but every rank holds twice the master copy and moments it needs."""

    def __init__(self, model, world_size, rank, *args, **kwargs):
        super().__init__(model, world_size, rank, *args, **kwargs)
        self.shard_numel *= 2
        self.padding = self.shard_numel * world_size - self.numel
        self.start = rank * self.shard_numel
        flat = self._padded(flatten_params(model).to(torch.float32))
        self.master = flat[self.start: self.start + self.shard_numel].clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)


def test_a_shard_of_the_wrong_size_is_caught_whatever_size_the_optimizer_reports():
    """The shard the formula is taken over comes from the model's parameter sizes and N
    (`scale_lab.padded_shard`), not from the optimizer being checked."""
    units = [(64 + 16) * 32] + [12 * 32 ** 2 + 13 * 32] * 2 + [2 * 32 + 32 * 64]  # ZeRO-3's
    assert sum(units) == TINY_PARAMETERS  # and one bucket of 25 MiB holds the whole model
    assert [scale_lab.padded_shard(TINY, strategy, 7) for strategy in scale_lab.STRATEGIES] == [
        TINY_PARAMETERS, -(-TINY_PARAMETERS // 7), -(-TINY_PARAMETERS // 7),
        sum(-(-size // 7) for size in units)]
    with faults.in_place_of_zero1(TwicePaddedZero):
        table = scale_lab.sweep(TINY, world_sizes=(4,), strategies=("ZeRO-1",))
    row = table.iloc[0]
    assert row.shard_numel == 2 * TINY_PARAMETERS // 4 and not row.matches
    assert row.counted - row.expected == 12 * TINY_PARAMETERS // 4


def test_the_tracker_says_in_which_phase_and_where_its_peak_fell():
    """The peak's phase is the one set when it was reached, its parts are the bytes live then
    by the phase that made them, and `peak_at` names the course's functions that ran."""
    from lesson_code.scale_lab.storages import StorageTracker
    with StorageTracker() as tracker:
        kept = torch.zeros(100, dtype=torch.uint8)          # building: 100 bytes, kept
        tracker.reset_peak("forward")
        saved = torch.zeros(50, dtype=torch.uint8)          # forward: 50 bytes
        tracker.phase = "backward"
        passing = torch.zeros(400, dtype=torch.uint8)       # the peak: 550 bytes
        del passing
        tracker.phase = "optimizer"
        later = torch.zeros(300, dtype=torch.uint8)         # 450 bytes: below the peak
    assert tracker.peak == 550 and tracker.peak_in == "backward"
    assert tracker.peak_by_phase == {"building": 100, "forward": 50, "backward": 400}
    assert tracker.peak_at == ""  # called from a test, not from the course's code
    assert kept.numel() + saved.numel() + later.numel() == 450
    rows = {strategy: scale_lab.simulate(replace(TINY, strategy=strategy), 4, [3])[0]
            for strategy in scale_lab.STRATEGIES}
    for row in rows.values():
        assert sum(row["peak_by_phase"].values()) == row["peak"]
    # ZeRO-1's step peaks in its all-gather of the whole model, its setup in the fp32 cast
    assert rows["ZeRO-1"]["peak_in"] == "optimizer"
    gather = "zero.ZeroOptimizer._gather_parameters > comm.Communicator.all_gather"
    assert gather in rows["ZeRO-1"]["peak_at"]
    assert rows["ZeRO-1"]["setup_peak_at"].endswith("zero.ZeroOptimizer.__init__")
    assert rows["DDP"]["peak_at"].endswith("zero.MasterAdam.step > zero.adam_update")
    assert rows["ZeRO-2"]["peak_in"] == rows["ZeRO-3"]["peak_in"] == "backward"


def test_the_tracker_follows_a_storage_made_before_it_once_an_operation_returns_a_view():
    """The batch is made before the step's tracker; MiniGPT's loss reshapes its targets, a
    view, and from then on their storage is counted as made in the forward."""
    from lesson_code.scale_lab.storages import StorageTracker
    targets = torch.zeros(2, 16, dtype=torch.long, device="meta")
    tokens = torch.zeros(2, 16, dtype=torch.long, device="meta")
    with StorageTracker("forward") as tracker:
        flat = targets.reshape(-1)
        assert tracker.live_bytes() == 2 * 16 * 8  # the targets' storage, not the tokens'
    assert flat._base is targets  # a view: no storage of its own
    assert tracker.peak_by_phase == {"forward": 256} and tokens.nbytes == 256


def test_a_storage_resized_outside_an_operation_counts_at_once_only_under_peaks_on_resize():
    """Without the patch, a storage grown and shrunk again with no operation in between never
    reaches the peak; under `peaks_on_resize` it does, and ZeRO-3's peaks stay as they were,
    since its all-gather's output follows each refill at once."""
    from lesson_code.scale_lab.storages import StorageTracker, peaks_on_resize

    def grow_and_shrink():
        with StorageTracker() as tracker:
            unit = torch.empty(0, dtype=torch.uint8, device="meta")
            unit.untyped_storage().resize_(1000)
            unit.untyped_storage().resize_(0)
        return tracker.peak

    assert grow_and_shrink() == 0
    with peaks_on_resize() as seen:
        assert grow_and_shrink() == 1000
    assert seen == {"resizes": 2}
    run = replace(TINY, strategy="ZeRO-3")
    plain = scale_lab.simulate(run, 4, [3])[0]
    with peaks_on_resize() as seen:
        patched = scale_lab.simulate(run, 4, [3])[0]
    assert seen["resizes"] > 0
    assert (patched["peak"], patched["setup_peak"]) == (plain["peak"], plain["setup_peak"])


def test_the_end_of_the_forward_holds_what_the_backward_frees_at_its_peak():
    """`forward_end_by_phase` is read when the forward returns: every activation the backward
    will need is live then, so a peak inside the backward finds no more of the forward's bytes;
    at DDP's and ZeRO-1's peaks, in the optimizer, none is left but the loss targets and the
    loss itself (one bf16 scalar, deleted after the step)."""
    for strategy in scale_lab.STRATEGIES:
        row = scale_lab.simulate(replace(TINY, strategy=strategy), 4, [3])[0]
        at_end = row["forward_end_by_phase"]["forward"]
        assert at_end >= row["peak_by_phase"].get("forward", 0), strategy
        targets = 8 * TINY.sequences_per_rank * TINY.gpt.context  # int64, a view from the loss
        assert at_end > 10 * targets  # the activations
        if row["peak_in"] == "optimizer":
            assert row["peak_by_phase"]["forward"] == targets + 2


def test_the_profiler_as_the_course_runs_it_sees_only_its_own_threads_allocations():
    """Like the storage tracker, `AllocationTrace` (torch's profiler with profile_memory=True)
    records allocations made on the thread that started it, not on another Python thread,
    as DDP's ring thread is: the page says both instruments share that blind spot."""
    import threading

    from lesson_code.harness.allocations import AllocationTrace
    kept = []
    with AllocationTrace("cpu") as trace:
        kept.append(torch.empty(3_000_000, dtype=torch.uint8))
        other = threading.Thread(target=lambda: kept.append(torch.empty(10_000_000,
                                                                         dtype=torch.uint8)))
        other.start()
        other.join()
    sizes = [block.nbytes for block in trace.allocations]
    assert 3_000_000 in sizes and 10_000_000 not in sizes
    assert [tensor.numel() for tensor in kept] == [3_000_000, 10_000_000]


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="what a CPU-only build of torch does")
def test_fake_cuda_tensors_on_a_cpu_only_build_multiply_but_do_not_train():
    """Under FakeTensorMode a CPU-only build makes and multiplies `cuda` tensors, refuses to
    build an nn.Linear on `cuda` (its random initialization), and aborts the interpreter on an
    operation on a `cuda` tensor that requires a gradient, as the page says."""
    import subprocess
    import sys
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        weight = torch.empty(64, 64, device="cuda")
        assert (weight @ weight).device.type == "cuda"
        with pytest.raises(RuntimeError, match="not linked with support for cuda"):
            torch.nn.Linear(64, 64, device="cuda")
    script = ("import torch\n"
              "from torch._subclasses.fake_tensor import FakeTensorMode\n"
              "with FakeTensorMode():\n"
              "    w = torch.empty(8, 8, device='cuda', requires_grad=True)\n"
              "    (w @ w).sum()\n"
              "print('ran')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "not linked with support for cuda" in done.stderr


def test_fsdp2_runs_under_fake_cpu_tensors_in_the_fake_group_but_not_on_the_meta_device():
    """PyTorch's FSDP2 in the fake group: `fully_shard` shards a model built on the meta device
    but its first forward refuses meta parameters; built under FakeTensorMode on the CPU (the
    device mesh made before the mode: built inside, it reads a value), it runs a step of
    forward, backward and Adam, and FSDPMemTracker reads this rank's bytes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from lesson_code.models import MiniGPT
    from lesson_code.runtime import simulated

    def sharded(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    with simulated.fake_rank(4, 3):
        mesh = init_device_mesh("cpu", (4,))
        with torch.device("meta"):
            model = sharded(MiniGPT(TINY.gpt), mesh)
        assert sum(p.to_local().numel() for p in model.parameters()) == TINY_PARAMETERS // 4
        tokens = torch.zeros(1, TINY.gpt.context, dtype=torch.long, device="meta")
        with pytest.raises(RuntimeError, match="materialized from meta device"):
            model(tokens, tokens)
        with FakeTensorMode():
            model = sharded(MiniGPT(TINY.gpt), mesh)
            tokens = torch.zeros(1, TINY.gpt.context, dtype=torch.long)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            with FSDPMemTracker(model, optimizer) as tracker:
                model(tokens, tokens)[1].backward()
                optimizer.step()
        [peak] = tracker.get_tracker_snapshot("peak").values()
        current = next(iter(tracker.get_tracker_snapshot("current").values()))
    # fp32 parameters: this rank's quarter of every one, 4 bytes each (no padding: 4 divides
    # each parameter's first dimension here); after the step Adam's two moments of the shard
    # and its step count, a 4-byte scalar, for each of the model's 29 parameters.
    assert peak["Sharded Param"] == 4 * TINY_PARAMETERS // 4
    assert current["OptState"] == 2 * 4 * TINY_PARAMETERS // 4 + 4 * 29
    assert peak["All Gather"] > 0  # a unit gathered at the peak


def test_the_zero_papers_table_from_running_code():
    table = scale_lab.paper_table()
    parameters = table.attrs["parameters"]
    assert abs(parameters - 7.5e9) < 1e6 and table.attrs["world_size"] == 64
    assert table.agrees.all(), table[["paper_GB", "measured_GB"]]
    for stage, row in table.iterrows():
        # the formula over real shards: no padding at this shape, so exactly memory's formula
        assert row.measured_GB == pytest.approx(row.formula_GB, rel=1e-12)
        assert row.sent_GB == pytest.approx(row.formula_sent_GB, rel=1e-12)
        assert row.padding == 0
    masks = 36 * 1024 * 1024  # a causal mask of 1024 x 1024 bools per block
    assert table.loc["DDP", "beyond"] == {"gradients: buckets": 2 * parameters,
                                          "buffers: model buffers": masks}
    assert table.loc["ZeRO-1", "beyond"] == {"gradients: shard": 2 * parameters // 64,
                                             "buffers: model buffers": masks}
    for stage in ("ZeRO-2", "ZeRO-3"):
        assert table.loc[stage, "beyond"] == {"buffers: model buffers": masks}
    assert (table.peak_GB > table.held_GB).all()
    # ZeRO-1's step peaks in the all-gather of the whole bf16 model (2 Psi), while the whole
    # .grad is held: the step adds that and 8 bytes per element of the rank's shard (the fp32
    # gradient, the bf16 master copy it sends, the averaged bf16 shard); 8 Psi while building.
    zero1 = table.loc["ZeRO-1"]
    assert zero1.peak_in == "optimizer" and "_gather_parameters" in zero1.peak_at
    assert round(zero1.at_peak_optimizer_GB * 1e9) == 2 * parameters + 8 * parameters // 64
    assert round(zero1.at_peak_backward_GB * 1e9) == 2 * parameters  # the whole .grad
    assert round(zero1.setup_peak_GB * 1e9) == 8 * parameters + masks
    assert "ZeroOptimizer.__init__" in zero1.setup_peak_at
    assert (table.loc[["ZeRO-2", "ZeRO-3"], "peak_in"] == "backward").all()
    parts = scale_lab.peak_summary(table)
    assert list(parts.columns) == [*scale_lab.PEAK_PARTS.values(), "peak in the step GB", "peak at"]
    assert set(scale.table(parts, "fa").columns) <= set(scale.TABLE_LABELS.values())
    # Each rank builds the whole model in float32 before it shards it (zero_lab.run_model).
    assert (table.setup_peak_GB >= 4 * parameters / 1e9).all()
    summary = scale_lab.paper_summary(table)
    assert summary["paper GB"].tolist() == [120.0, 31.4, 16.6, 1.9]
    assert summary.loc["DDP", "beyond the paper GB"] == round((2 * parameters + masks) / 1e9, 3)
    persian = scale.table(summary, "fa")
    assert "هم‌خوان" in persian.columns and persian["هم‌خوان"].all()
    assert "<td" in persian._repr_html_() and "۱۲۰" in persian._repr_html_()


def test_the_stored_sweep_is_what_the_code_measures_now(tmp_path):
    """The book reads the stored sweep instead of running it: a live run of two of its world
    sizes must find the same bytes in every compared column, and a changed byte is named."""
    table, note = stored.load()
    assert set(table.N) == set(scale_lab.SWEEP_SIZES) and set(table.strategy) == set(scale_lab.STRATEGIES)
    assert table.matches.all() and note["command"] == stored.COMMAND
    live = scale_lab.sweep(world_sizes=(4, 64))
    assert stored.differences(live, table).empty
    tampered = table.copy()
    tampered.loc[(tampered.N == 64) & (tampered.strategy == "ZeRO-1"), "optimizer"] += 4
    found = stored.differences(live, tampered)
    assert found[["N", "strategy", "column"]].values.tolist() == [[64, "ZeRO-1", "optimizer"]]
    assert stored.differences(scale_lab.sweep(TINY, world_sizes=(3,), strategies=("DDP",)),
                              table).column.tolist() == ["row"]
    # what the note says, in both editions, and a note of another run is refused
    assert report.stored_note(note, ScaleRun(), "en").startswith(note["description"])
    persian = report.stored_note(note, ScaleRun(), "fa")
    assert "۴٬۷۸۸٬۲۲۴" in persian and "measured" not in persian
    assert "`" not in persian and "رونوشت اصلی fp32 و گشتاورهای fp32" in persian
    with pytest.raises(ValueError, match="the stored sweep is of another run"):
        report.stored_note(note, TINY, "en")
    # written and read back whole, with its note
    path = stored.write(live, report.stored_description(ScaleRun()), tmp_path / "sweep.csv")
    again, again_note = stored.load(path)
    assert stored.differences(live, again).empty and again_note["description"] == note["description"]
    with pytest.raises(FileNotFoundError, match="--into-package"):
        stored.load(tmp_path / "none.csv")


def test_measured_points_are_plain_data_for_the_calculator(tiny_sweep):
    points = scale_lab.measured_points(tiny_sweep, TINY)
    assert points["model"]["parameters"] == TINY_PARAMETERS and points["dtype"] == "bfloat16"
    assert set(points["points"]) == set(scale_lab.STRATEGIES)
    zero3 = points["points"]["ZeRO-3"]
    assert [p["N"] for p in zero3] == sorted(p["N"] for p in zero3)
    assert all(isinstance(value, int) for p in zero3 for value in p.values())
    assert json.loads(json.dumps(points)) == points  # plain data, as the book's pages take it
    formula = memory.total_bytes("ZeRO-3", TINY_PARAMETERS, 4)
    assert any(p["N"] == 4 and p["model_states"] == formula for p in zero3)


def test_bad_arguments_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match="unknown strategy 'ZeRO-4'"):
        ScaleRun("ZeRO-4")
    with pytest.raises(ValueError, match="tokens=17 does not fit the model's context of 16"):
        replace(TINY, tokens=17)
    with pytest.raises(ValueError, match="unknown ranks 'some'"):
        scale_lab.chosen_ranks(4, "some")
    with pytest.raises(ValueError, match=r"ranks \[4\] are not in 0..3"):
        scale_lab.chosen_ranks(4, [0, 4])
    with pytest.raises(ValueError, match="profile=True needs real tensors"):
        scale_lab.measure_step(0, 1, TINY, shapes_only=True, profile=True)


SHALLOW = pipelined.PipelineScaleRun(gpt=GPTConfig(vocab_size=64, context=8, n_layer=6,
                                                   n_embd=16, n_head=2))


def test_every_pipeline_stage_sends_what_lesson_79s_protocol_sends():
    table = pipelined.sweep(SHALLOW, stage_counts=(1, 2, 3, 8))
    assert table.attrs["layers"] == 8 and list(table.groupby("P").size()) == [1, 2, 3, 8]
    assert (table.sent == table.formula_sent).all()
    # what one stage sends its neighbour, the neighbour receives: in all, as much as is sent
    assert (table.groupby("P").received.sum() == table.groupby("P").sent.sum()).all()
    for stages, group in table.groupby("P"):
        assert group.parameters.sum() == 4 * table.attrs["parameters"]  # float32, cut not copied
        assert (group.gradients == group.parameters).all()
        assert group.first_layer.tolist() == sorted(group.first_layer) and group.end_layer.max() == 8
        # 1F1B: stage s of P keeps at most P - s micro-batches' activations (and at most m)
        assert (group.peak_stored <= (stages - group.stage).clip(upper=SHALLOW.micro_batches)).all()
    losses = table.loss.dropna()
    assert len(losses) == 4 and (losses == losses.iloc[0]).all()  # the same step, however cut
    shown = pipelined.summary(table)
    assert list(shown.index) == [1, 2, 3, 8] and (shown["bytes sent, most"] == shown["protocol's bytes, most"]).all()
    assert shown.loc[8, ["layers per stage, fewest", "layers per stage, most"]].tolist() == [1, 1]
    assert shown.loc[3, ["layers per stage, fewest", "layers per stage, most"]].tolist() == [2, 3]
    with pytest.raises(ValueError, match="9 stages but only 8 layers"):
        pipelined.sweep(SHALLOW, stage_counts=(9,))


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_command_reports_what_it_measures_and_what_it_cannot(lang, capsys):
    assert scale_lab_command.main(["--world-sizes", "1,4", "--skip", "paper,pipeline",
                                   "--lang", lang]) == 0
    out = capsys.readouterr().out
    # the pipeline's sentence only where the pipeline runs
    assert report.header(lang)[:3] == report.header(lang, pipeline=False)
    assert report.header(lang)[3] not in out and len(report.header(lang)) == 4
    if lang == "en":
        assert "Not measured: time, bandwidth" in out and "fake process group" in out
        assert "every rank held exactly the formula over its real shard" in out and ": True" in out
        assert "86.19/76.61" in out  # DDP: its buckets beside the formula's 16 bytes/parameter
    else:
        # contention named as the page names it, not as congestion («ازدحام»)
        assert "اندازه‌گیری‌نشده: زمان، پهنای باند، رقابت بر سر منابع" in out and ": بله" in out
        assert "۸۶٫۱۹/۷۶٫۶۱" in out and "86.19" not in out
        # plain text, not Markdown: no backticks, and the master copy named as the page names it
        assert "`" not in out and '"' not in out  # Persian quotes: «fake», «meta»
        fake, meta = language.isolated("fake"), language.isolated("meta")  # code, left to right
        assert f"گروه فرایند «{fake}»" in out and f"دستگاه «{meta}»" in out
        assert "رونوشت اصلی fp32 و گشتاورهای fp32" in out


def test_the_command_refuses_bad_arguments_with_status_2(capsys):
    for argv, says in ((["--world-sizes", "4,0"], "0 is not positive"),
                       (["--skip", "paper,table"], "'table': pass parts among sweep, paper"),
                       (["--lang", "de"], "invalid choice: 'de'"),
                       (["--stages", "1,600"], "--stages 600: the pipeline's model has 512 layers"),
                       (["--into-package", "--world-sizes", "4"], "--into-package stores the whole")):
        with pytest.raises(SystemExit) as exited:
            scale_lab_command.main(argv)
        assert exited.value.code == 2 and says in capsys.readouterr().err
