"""What the labs and make selfcheck print, in both editions: the English lines as they were, the
Persian ones with the same facts, numbers by the course's rule, and no English word. Also the
practice reports' titles, hints, timing lines and failure phrases: in Persian, their code stands
in left-to-right isolates."""

import ast
import math
import re
import string
from pathlib import Path

import pytest
import torch

from lesson_code import collectives_lab, ddp_lab, pipeline_exercises, pipeline_lab, selfcheck, zero_lab
from lesson_code.harness import cli_args
from lesson_code.models import as_layers, build_model
from lesson_code.pipeline import partition_layers, split_micro_batches

LRI, PDI = "\u2066", "\u2069"
NAMES = {"MiniGPT", "MLP", "SGD", "Adam", "DDP", "PyTorch", "GPipe", "F1B", "FSDP2", "ZeRO", "KiB",
         "MB", "MiB", "gloo", "torch", "distributed", "m", "x"}


def latin_words(text: str) -> set[str]:
    """Latin words of a Persian line outside `code` and left-to-right isolates, less names."""
    text = re.sub(f"`[^`]*`|{LRI}[^{PDI}]*{PDI}", " ", text)
    return set(re.findall(r"[A-Za-z][A-Za-z0-9]*", text)) - NAMES


def test_lesson_76s_lines_in_both_editions():
    assert collectives_lab.crossover_line(9648.2 * 1024, [4194304, 16777216], "en") == (
        "model: ring faster above 9648 KiB; measured: ring faster at [4194304, 16777216] bytes")
    persian = collectives_lab.crossover_line(9648.2 * 1024, [4194304, 16777216], "fa")
    assert "۹۶۴۸ KiB" in persian and "در ۴٬۱۹۴٬۳۰۴ و ۱۶٬۷۷۷٬۲۱۶ بایت" in persian
    three = collectives_lab.crossover_line(9648.2 * 1024, [4096, 65536, 16777216], "fa")
    assert three.endswith("در ۴٬۰۹۶، ۶۵٬۵۳۶ و ۱۶٬۷۷۷٬۲۱۶ بایت سریع‌تر بود")
    assert not latin_words(persian)
    assert collectives_lab.crossover_line(math.inf, [16777216], "en") == (
        "model: ring never faster (its fitted cost per byte is the higher); "
        "measured: ring faster at [16777216] bytes")
    assert collectives_lab.crossover_line(0.0, [], "en") == (
        "model: ring faster at every size; measured: ring faster at no size")
    for crossover in (math.inf, 0.0, 9648.2 * 1024):
        persian = collectives_lab.crossover_line(crossover, [16777216], "fa")
        assert "inf" not in persian and "۱۶٬۷۷۷٬۲۱۶" in persian and not latin_words(persian)
    persian = collectives_lab.crossover_line(9648.2 * 1024, [], "fa")
    assert persian.endswith("در هیچ اندازه‌ای سریع‌تر نبود") and "[" not in persian
    switches = [(1109352, "naive", "shared_memory")]
    assert collectives_lab.switches_line(switches, "en") == (
        "predicted switches (bytes, from, to): [(1109352, 'naive', 'shared_memory')]")
    persian = collectives_lab.switches_line(switches, "fa")
    assert persian.startswith("نقطه‌های تغییر الگوریتم (پیش‌بینی‌شده): ")
    assert "در ۱٬۱۰۹٬۳۵۲ بایت از روش ساده‌لوحانه به حافظهٔ مشترک" in persian
    assert not latin_words(persian)
    for lang in ("en", "fa"):  # no switch in the range: a word, not an empty list or nothing
        empty = collectives_lab.switches_line([], lang)
        assert empty.endswith(collectives_lab.say("no_switch", lang)) and "[]" not in empty
    worst = {"all_reduce": 0.78, "reduce_scatter": 0.56}
    assert collectives_lab.worst_line(worst, "en") == f"worst ratio of each: {worst}"
    assert collectives_lab.worst_line(worst, "fa") == (
        "بدترین نسبت هر کدام: کاهش همگانی ۰٫۷۸، کاهش و پخش ۰٫۵۶")
    assert collectives_lab.say("without", "en", low=1.02, high=1.35) == (
        "without shared memory, from 4 MiB up: 1.02x to 1.35x")
    assert not latin_words(collectives_lab.say("without", "fa", low=1.02, high=1.35))


def test_lesson_76as_printed_gaps_read_in_each_edition():
    gaps = {2 ** 22: 1.894, 2 ** 24: 2.204}
    assert collectives_lab.ratios_line("direct_over_shared_memory", gaps, "en") == (
        "direct over shared memory: 1.89x at 4,194,304 bytes; 2.20x at 16,777,216 bytes")
    assert collectives_lab.inversion_at_line("naive", 1.8612, 1024, "en") == (
        "largest inversion: naive 1.86x at 1,024 bytes")
    persian = [collectives_lab.ratios_line("direct_over_shared_memory", gaps, "fa"),
               collectives_lab.inversion_at_line("naive", 1.8612, 1024, "fa")]
    assert "۱٫۸۹ برابر در ۴٬۱۹۴٬۳۰۴ بایت" in persian[0]
    assert persian[0].startswith("نسبت زمانِ روش مستقیم به حافظهٔ مشترک: ")  # «بر» read «on»
    assert " بر " not in collectives_lab.SAY["fa"]["direct_over_shared_memory"]
    assert persian[1] == "بزرگ‌ترین وارونگی: روش ساده‌لوحانه ۱٫۸۶ برابر در ۱٬۰۲۴ بایت"
    assert not any(latin_words(line) for line in persian)  # no English keys


def test_the_persian_verdict_is_spelled_as_the_glossary_and_says_not_beyond_the_bar():
    book = [{"algorithm": name, "nbytes": n, "seconds": t} for name, times in
            (("naive", (1.0, 2.0, 8.0)), ("shared_memory", (2.4, 2.1, 3.9)))
            for n, t in zip((2 ** 18, 2 ** 20, 2 ** 22), times)]
    assert "هم‌خوان" in collectives_lab.switch_verdict(book, 1.86, 0.5, 2, "fa")
    close = [dict(row, seconds=1.0) for row in book]  # every gap 1: within the bar
    assert "فاصله: نه بیش از ۱٫۸۶ برابر" in collectives_lab.switch_verdict(close, 1.86, 0.5, 2, "fa")


def test_lesson_76s_run_is_read_against_its_own_largest_inversion():
    ring = {4096: 31.6, 65536: 19.0, 1048576: 20.3, 4194304: 23.4, 16777216: 54.5}
    naive = {4096: 6.5, 65536: 4.2, 1048576: 4.5, 4194304: 13.4, 16777216: 55.7}
    assert collectives_lab.largest_inversion(ring) == pytest.approx(31.6 / 19.0)  # 4 KiB vs 64 KiB
    assert collectives_lab.largest_inversion({1: 1.0, 2: 2.0, 4: 4.0}) == 1.0  # rising: none
    assert collectives_lab.ahead_line(ring, naive, 1.66, "en") == (
        "faster by more than the largest inversion, 1.66x: "
        "naive at [4096, 65536, 1048576, 4194304] bytes; neither at [16777216] bytes")
    persian = collectives_lab.ahead_line(ring, naive, 1.66, "fa")
    assert "هیچ‌یک در ۱۶٬۷۷۷٬۲۱۶ بایت" in persian and "۱٫۶۶" in persian and not latin_words(persian)
    assert collectives_lab.inversion_line({"ring": 1.663}, "en") == "largest inversion: ring 1.66x"
    assert not latin_words(collectives_lab.inversion_line({"حلقه": 1.663}, "fa"))
    for lang in ("en", "fa"):  # a crossover above the largest size timed is an extrapolation
        above = collectives_lab.crossover_line(30388 * 1024, [16777216], lang, largest=2 ** 24)
        below = collectives_lab.crossover_line(9648.2 * 1024, [16777216], lang, largest=2 ** 24)
        marked = collectives_lab.say("extrapolated", lang)
        assert marked in above and marked not in below


def test_lesson_77s_lines_in_both_editions():
    row = dict(model="gpt", optimizer="adam", wrapper="bucketed", identical=True,
               param_diff=2.36e-4, torch_diff=1.19e-7, loss_diff=4.77e-7, first=4.2685, last=2.9742)
    assert ddp_lab.say("row", "en", **row) == (
        "  gpt adam bucketed ranks identical: True  max |param diff| 2.4e-04 (vs torch DDP "
        "1.2e-07)  max |loss diff| 4.8e-07  loss 4.269 -> 2.974")
    persian = ddp_lab.say("row", "fa", **row)
    assert "MiniGPT Adam باکت‌دار" in persian and "بله" in persian
    assert f"{LRI}۲٫۴ × ۱۰⁻⁴{PDI}" in persian and f"{LRI}۱٫۲ × ۱۰⁻⁷{PDI}" in persian
    assert not latin_words(persian) - {"DDP", "PyTorch"}, persian
    assert ddp_lab.say("gradients", "en", mib=17.41, mb=18.26) == (
        "gradients: 17.4 MiB per rank (18.3 MB)")
    assert ddp_lab.say("gradients", "fa", mib=17.41, mb=18.26) == (
        "گرادیان‌ها: ۱۷٫۴ MiB در هر رتبه (۱۸٫۳ MB)")
    facts = {"auto": dict(mb=4, ranks=4, algorithm="shared_memory"),
             "fit": dict(alpha_us=1672.87, gbps=1.0644),
             "cluster": dict(parameters=163037184, mib=621.94, backward_ms=42.739, ranks=4,
                             ratio=1.05),
             "exposed": dict(ms=68.94, inside=3, ranks=4)}
    assert ddp_lab.say("exposed", "en", **facts["exposed"]) == (
        "the step's exposed communication (last wait end - last backward end, on one clock for "
        "all ranks): 68.9 ms\n"
        "ranks whose first all-reduce started before their own backward ended: 3 of 4")
    persian = ddp_lab.say("exposed", "fa", **facts["exposed"])
    assert "با یک زمان‌سنج برای همهٔ رتبه‌ها): ۶۸٫۹ میلی‌ثانیه\n" in persian
    assert persian.endswith("پیش از پایانِ گذر برگشتِ خودشان آغاز شد: ۳ از ۴")
    assert ddp_lab.say("fit", "en", **facts["fit"]) == (
        "ring all-reduce fitted to these times: α = 1673 µs per message, 1/β = 1.06 GB/s")
    assert "۱۶۳٬۰۳۷٬۱۸۴ پارامتر" in ddp_lab.say("cluster", "fa", **facts["cluster"])
    for key, values in facts.items():
        persian = ddp_lab.say(key, "fa", **values)
        assert not latin_words(persian) - {"GPT", "GPU", "GB", "µs", "float32", "s"}, persian
        shown = re.sub(f"{LRI}[^{PDI}]*{PDI}|float32|GPT-2|1/β", "", persian)
        assert not re.search(r"[0-9]", shown), persian
        assert "`" not in persian, persian  # a printed line: code names isolated, not backticked
    assert ddp_lab.say("auto", "fa", **facts["auto"]) == (
        f"انتخاب {LRI}auto{PDI} برای باکتی ۴ MiB روی ۴ رتبه، از زمان‌های ذخیره‌شدهٔ درس ۷۶: "
        f"{LRI}shared_memory{PDI}")
    assert ddp_lab.say("auto", "en", **facts["auto"]).startswith("auto's choice for a 4 MiB")


def test_lesson_78s_lines_in_both_editions():
    row = dict(rank=1, parameters=27688, gradients=27688, ddp=83064, zero=41532, formula=41532)
    assert zero_lab.say("row", "en", **row) == (
        "  rank 1             27688      27688            83064               41532       41532")
    assert zero_lab.say("row", "fa", **row) == "  رتبهٔ ۱: ۲۷۶۸۸، ۲۷۶۸۸، ۸۳۰۶۴، ۴۱۵۳۲، ۴۱۵۳۲"
    peak = dict(rank=0, peak=25944336, peak_in="گذر برگشت", activations=1109096)
    assert zero_lab.say("peak", "fa", **peak) == (
        "  رتبهٔ ۰: بیشینهٔ اندازه‌گیری‌شده ۲۵٬۹۴۴٬۳۳۶ (در گذر برگشت)، فعال‌سازی‌ها ۱٬۱۰۹٬۰۹۶")
    for key, values in [("title", dict(ranks=4, params=6922, padding=2, shard=1731, lr=0.01)),
                        ("formula", dict(parameters=810752, formula=16215040.0)),
                        ("identical", dict(identical=True)), ("header", {})]:
        assert not latin_words(zero_lab.say(key, "fa", **values)) - {"MLP", "MiniGPT"}


def refused(call) -> ValueError:
    with pytest.raises(ValueError) as caught:
        call()
    return caught.value


def test_lesson_79s_refusals_and_report_in_both_editions():
    too_many = refused(lambda: partition_layers(as_layers(build_model("gpt", 0)), 5))
    uneven = refused(lambda: split_micro_batches(torch.zeros(16, 16), 5))
    assert pipeline_exercises.explain_refusal(too_many, "en") == str(too_many)
    assert pipeline_exercises.explain_refusal(too_many, "fa").startswith("۵ مرحله اما فقط ۴ لایه")
    assert pipeline_exercises.explain_refusal(uneven, "fa").startswith("دستهٔ ۱۶تایی به ۵ میکرودستهٔ برابر")
    assert not latin_words(pipeline_exercises.explain_refusal(uneven, "fa"))
    other = refused(lambda: split_micro_batches(torch.zeros(16, 16), 0))  # refused by a helper
    assert pipeline_exercises.explain_refusal(other, "fa") == str(other)
    run = pipeline_lab.PipeRun(schedule="1f1b", micro_batches=4)
    stages = [{"peak_stored": 2, "traffic": {"bytes_sent": 100}}] * 2
    check = {"max_grad_diff": 1.5e-8, "loss_diff": 0.0}
    assert pipeline_lab.report_line(run, check, stages) == (
        "  1f1b  m=4: max |grad diff| 1.5e-08, |loss diff| 0.0e+00, activations stored at most "
        "[2, 2], bytes sent [100, 100] per stage")
    persian = pipeline_lab.report_line(run, check, stages, "fa")
    assert persian.startswith("  1F1B با m = ۴") and "[۱۰۰، ۱۰۰]" in persian
    assert not latin_words(persian), persian


def test_selfchecks_line_in_both_editions():
    results = [{"ok": True, "facts": {"identical": True, "diff": 1.2e-8}, "backend": "gloo",
                "device": "cpu", "seconds": 3.21}] * 4
    assert selfcheck.report_line("77", "data parallel", results, "en") == (
        "lesson 77 data parallel  PASS  gloo x4 on cpu     ranks identical True, max |param - one "
        "process| 1.2e-08 (< 1e-6)  (3.2 s)")
    persian = selfcheck.report_line("77", "data parallel", results, "fa")
    assert persian.startswith("درس ۷۷ موازی‌سازی داده قبول") and "(۳٫۲ ثانیه)" in persian
    assert not latin_words(persian), persian
    assert set(selfcheck.DETAILS) == {name for checks in selfcheck.CHECKS.values()
                                      for name, _ in checks}


@pytest.mark.parametrize("main", [collectives_lab.main, pipeline_lab.main, selfcheck.main])
def test_every_command_takes_lang_and_refuses_another(main, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--lang", "de"])
    assert exited.value.code == 2 and "--lang: invalid choice: 'de'" in capsys.readouterr().err
    args = cli_args.lab_arguments(["--lang", "fa"], "ddp_lab", "", steps=1, batch_size=16)
    assert args.lang == "fa"


CODE_PUNCTUATION = set("()'\"._[]=/")
# A run of characters that is neither space nor Arabic script (Persian letters, digits, «،»).
NOT_PERSIAN = re.compile(r"[^\s\u0600-\u06FF\u200c]+")
# A Persian letter (not a digit or a punctuation mark of Arabic script).
PERSIAN_LETTER = "[\u0620-\u064A\u0671-\u06D3\u06FA-\u06FF]"


def bidi_problems(line: str) -> list[str]:
    """What a right-to-left line would show out of order: outside its isolates, a Latin run that
    holds code punctuation, two Latin runs with no Persian letter between them (the line would
    show them as one left-to-right run), or a Latin run followed by a number with no Persian
    letter between (the number would join the Latin run)."""
    rest = re.sub(f"{LRI}[^{PDI}]*{PDI}", " ", line)
    runs = [found for found in NOT_PERSIAN.finditer(rest) if re.search("[A-Za-z]", found[0])]
    problems = []
    for found in runs:
        # Prose parentheses around a word, «(gloo ...)» or «(Adam)», are not code: one of each goes.
        word = found[0].removeprefix("(").removesuffix(")")
        if CODE_PUNCTUATION & set(word):
            problems.append(f"code outside an isolate: {found[0]!r}")
    for first, second in zip(runs, runs[1:]):
        if not re.search(PERSIAN_LETTER, rest[first.end():second.start()]):
            problems.append(f"two Latin runs read as one: {first[0]!r} {second[0]!r}")
    for found in runs:
        if re.match(r"\W*[0-9\u06F0-\u06F9]", rest[found.end():]):  # a Persian letter is \w
            problems.append(f"a number joins {found[0]!r}")
    return problems


def test_bidi_problems_are_found_outside_isolates_only():
    assert bidi_problems("schedule_order('gpipe', ...) برای ۱ تا ۵ مرحله")
    assert bidi_problems("pipelined_step، MiniGPT، زمان‌بندی")
    assert bidi_problems("زمان‌بندی ⁦'1f1b'⁩، MiniGPT، ۴ میکرودسته")
    assert not bidi_problems("⁦pipelined_step⁩، ⁦MiniGPT⁩، زمان‌بندی ⁦'1f1b'⁩، ۴ میکرودسته")
    assert not bidi_problems("آموزش MiniGPT روی ۴ رتبه (gloo عملیات ⁦ReduceOp.AVG⁩ را ندارد)")
    assert not bidi_problems("آموزش با (Adam) روی دسته")
    assert bidi_problems("منتظر هر دو بمانید (work.wait())")


def _timing_phrase(practice):
    """The lesson's timing sentence part (what is timed), with its ranks not run."""
    names = practice.timing.__globals__
    run_ranks = names["run_ranks"]
    names["run_ranks"] = lambda *args, **kwargs: [([1e-3] * 9, [1e-3] * 9)]
    try:
        return practice.timing("my_file.py", 1.0).what
    finally:
        names["run_ranks"] = run_ranks


def test_practice_reports_isolate_code_in_persian_titles_hints_and_timing():
    from lesson_code.practice.lessons import LESSONS
    from lesson_code.practice.messages import localized, plain

    found = {}
    for number, practice in LESSONS.items():
        lines = {f"{check.key} {part}": plain(getattr(check, part)["fa"], "fa")
                 for check in practice.checks for part in ("title", "hint")}
        if practice.timing is not None:
            what = _timing_phrase(practice)
            lines["timing"] = what.text("fa")
            # English keeps its template as written (backticks too), only its fields filled.
            assert what.text("en") == what.en.format(
                **{name: localized(value, "en") for name, value in what.fields.items()})
        for where, line in lines.items():
            problems = bidi_problems(line)
            if problems:
                found[f"{number} {where}"] = (line, problems)
    assert not found, found


PRACTICE = Path(__file__).resolve().parents[2] / "lesson_code" / "practice"
# The functions that build a Phrase from text made elsewhere, not from two literals.
BUILT_ELSEWHERE = {("messages.py", "with_fields"), ("messages.py", "phrase"),
                   ("messages.py", "listing"), ("messages.py", "lesson_name"),
                   ("grading.py", "_case_note")}
# Fields that hold code wherever they are filled in: a call, a name of the learner's file, a file.
CODE_FIELDS = {"call", "name", "function", "file", "folder", "op", "value", "keys"}
CODE_SAMPLE = "torch.save(shard)"
PROSE_SAMPLE = "مقدار"  # any other field: a number (in Persian digits) or a phrase in Persian


def _makes_text(node: ast.expr) -> bool:
    """Whether a field's expression makes a string (code: a literal, a repr, a joined list)."""
    if isinstance(node, ast.IfExp):
        return _makes_text(node.body) or _makes_text(node.orelse)
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return isinstance(node, ast.JoinedStr) or isinstance(node.value, str)
    return isinstance(node, ast.Call) and (getattr(node.func, "id", None) in ("repr", "str") or
                                           getattr(node.func, "attr", None) in ("join", "replace"))


def _persian_filled(template: str, code: set[str]) -> str:
    """`template` as a Persian report prints it, each field in `code` filled with code."""
    from lesson_code.practice.messages import Phrase

    fields = {field for _, field, _, _ in string.Formatter().parse(template) if field}
    return Phrase("", template, {field: CODE_SAMPLE if field in code else PROSE_SAMPLE
                                 for field in fields}).text("fa")


def _practice_phrases() -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Every `phrase(en, fa, ...)` and `Phrase(en, fa, ...)` of the practice package, read from
    its source: {file:line: the Persian line with its fields filled}, and the functions that
    build a Phrase from other text."""
    lines, built = {}, set()
    for path in sorted(PRACTICE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [node for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            called = getattr(node, "func", None)
            if not (isinstance(node, ast.Call) and
                    getattr(called, "id", getattr(called, "attr", None)) in ("phrase", "Phrase")):
                continue
            texts = node.args[:2]
            if len(texts) < 2 or not all(isinstance(text, ast.Constant) and
                                         isinstance(text.value, str) for text in texts):
                inside = [f for f in functions if f.lineno <= node.lineno <= f.end_lineno]
                built.add((path.name, max(inside, key=lambda f: f.lineno).name if inside else ""))
                continue
            code = {keyword.arg for keyword in node.keywords if _makes_text(keyword.value)}
            lines[f"{path.relative_to(PRACTICE)}:{node.lineno}"] = _persian_filled(
                texts[1].value, code | CODE_FIELDS)
    return lines, built


def test_practice_phrases_and_failures_isolate_code_in_persian():
    from lesson_code.practice.messages import FAILURES

    lines, built = _practice_phrases()
    assert len(lines) > 150 and built == BUILT_ELSEWHERE, built
    lines.update({f"FAILURES {kind}": _persian_filled(template, CODE_FIELDS)
                  for kind, template in FAILURES["fa"].items()})
    found = {where: (line, problems) for where, line in lines.items()
             if (problems := bidi_problems(line))}
    assert not found, found
