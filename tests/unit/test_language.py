"""How the Persian edition writes a number and fills a sentence (lesson_code.language)."""

import pytest

from lesson_code import language

LRI, PDI = "\u2066", "\u2069"


@pytest.mark.parametrize("value, spec, shown", [
    (3.814697e-06, "", f"{LRI}۳٫۸۱ × ۱۰⁻⁶{PDI}"),  # small: three digits times a power of ten
    (1e-08, "", f"{LRI}۱۰⁻⁸{PDI}"),
    (0.25, "", "۰٫۲۵"),
    (9.676828e-03, ".6e", "۰٫۰۰۹۶۸"),  # written plainly from 0.001 up, whatever the spec
    (2.5e7 + 0.5, ".1f", f"{LRI}۲٫۵ × ۱۰⁷{PDI}"),  # large and not whole
    (4788224, "", "۴۷۸۸۲۲۴"),  # a whole number stays whole
    (4788224, ",", "۴٬۷۸۸٬۲۲۴"),  # grouped with the Persian thousands mark
    (-0.41, ".2f", f"{LRI}−۰٫۴۱{PDI}"),  # the minus sign, isolated so it stays on the left
    (-0.0, ".1f", "۰٫۰"),
    (float("nan"), "", "—"),
    (0.125, ".1%", "۱۲٫۵٪"),
])
def test_a_number_in_persian_follows_one_rule(value, spec, shown):
    assert language.number(value, "fa", spec) == shown
    assert language.number(value, "en", spec) == format(value, spec)  # English: as formatted


def test_in_html_the_power_is_raised_and_the_isolate_is_a_bdi():
    assert language.number(-1.2e-05, "fa", html=True) == '<bdi dir="ltr">−۱٫۲ × ۱۰<sup>−۵</sup></bdi>'
    assert language.number(12, "fa", html=True) == "۱۲"


def test_text_that_is_not_one_number_and_an_unknown_language_are_refused():
    with pytest.raises(ValueError, match="'1 2' is not a number"):
        language.persian_number_text("1 2")
    with pytest.raises(ValueError, match="unknown language 'de': use one of en, fa"):
        language.number(1, "de")


def test_words_with_numbers_and_lists_take_the_persian_forms():
    assert language.numbered("رتبه", 2) == "رتبهٔ ۲"  # ezafe after a silent ه
    assert language.numbered("گام", 10) == "گام ۱۰"
    assert language.numbered("rank", 2, "en") == "rank 2"
    assert language.listed([1, 2, 3], "fa") == "1، 2، 3"
    assert language.listed(["a", "b"], "en") == "a, b"


def test_a_sentence_is_filled_by_the_rule_in_persian_and_as_format_in_english():
    template = "{n} ranks, {ms:.1f} ms, {ok}, {sizes}"
    values = {"n": 4, "ms": 2.25, "ok": True, "sizes": [4194304, 16777216]}
    assert language.fill(template, "en", **values) == template.format(**values)
    assert language.fill(template, "fa", **values) == "۴ ranks, ۲٫۲ ms, بله, [۴۱۹۴۳۰۴، ۱۶۷۷۷۲۱۶]"
    assert language.fill("{x}", "fa", x=-1.5e-07) == "\u2066−۱٫۵ × ۱۰⁻⁷\u2069"


def test_code_names_in_a_persian_sentence_stand_in_isolates_not_backticks():
    assert language.isolated_code("انتخاب `auto` برای `{algorithm}`") == (
        "انتخاب \u2066auto\u2069 برای \u2066{algorithm}\u2069")
    assert language.fill("انتخاب `auto`: `{name}`، {n} رتبه", "fa", name="ring", n=4) == (
        "انتخاب \u2066auto\u2069: \u2066ring\u2069، ۴ رتبه")
    assert language.fill("`auto` picks `{name}`", "en", name="ring") == "`auto` picks `ring`"
    assert language.isolated_code("a lone ` stays") == "a lone ` stays"
