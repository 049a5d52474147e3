"""explorl.analysis.text: quality issues, token categories, RFT filters (STILL; METHODS.md section 8)."""

import pytest

from explorl.analysis.text import (
    LOGICAL_WORDS,
    METACOGNITIVE_WORDS,
    category_counts,
    cut_after_first_box,
    format_issue,
    language_mixing,
    ngram_redundancy,
    quality_report,
    repetition_issue,
    rft_filter,
    rft_prepare,
    token_category,
)


def test_format_issue():
    assert not format_issue("so \\boxed{4}")
    assert format_issue("the answer is 4")
    assert format_issue("\\boxed{4} or \\boxed{5}")


def test_ngram_redundancy_hand_examples():
    # trigrams abc, bca, cab, abc: 3 distinct of 4 -> 1 - 3/4 = 0.25
    assert ngram_redundancy("a b c a b c") == pytest.approx(0.25)
    # all distinct -> 0
    assert ngram_redundancy("one two three four") == 0.0
    # "x x x x x x": 4 trigrams, 1 distinct -> 0.75
    assert ngram_redundancy("x x x x x x") == pytest.approx(0.75)
    # fewer than n words: no trigram -> 0
    assert ngram_redundancy("a b") == 0.0
    # bigrams of "a b a b": ab, ba, ab -> 1 - 2/3
    assert ngram_redundancy("a b a b", n=2) == pytest.approx(1 / 3)
    # whitespace of any kind separates words
    assert ngram_redundancy("a\nb  c\ta b c") == pytest.approx(0.25)


def test_ngram_redundancy_char_level():
    # "abcabc": character trigrams abc, bca, cab, abc -> 0.25
    assert ngram_redundancy("abcabc", level="char") == pytest.approx(0.25)
    # "aaaa": aaa, aaa -> 1 - 1/2
    assert ngram_redundancy("aaaa", level="char") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        ngram_redundancy("abc", level="byte")
    with pytest.raises(ValueError):
        ngram_redundancy("abc", n=0)


def test_repetition_issue_threshold():
    assert not repetition_issue("a b c a b c")  # 0.25 <= 0.31
    assert repetition_issue("x x x x x x")  # 0.75 > 0.31
    assert repetition_issue("a b c a b c", threshold=0.2)


def test_language_mixing():
    assert language_mixing("the answer is 所以 4")
    assert not language_mixing("the answer is 4, x\u00b2 + \u03c0")
    assert not language_mixing("\u3053\u3093\u306b\u3061\u306f")  # hiragana are not Chinese characters


def test_quality_report_fractions():
    texts = [
        "1 + 2 = 3 so \\boxed{3}",  # clean
        "the answer is 3",  # format
        "x x x x x x \\boxed{1}",  # repetition
        "答案 \\boxed{2} \\boxed{3}",  # format and language mixing
    ]
    rep = quality_report(texts)
    assert rep == {"n": 4, "format": 0.5, "repetition": 0.25, "language_mixing": 0.25, "any": 0.75}
    with pytest.raises(ValueError):
        quality_report([])


@pytest.mark.parametrize("token,category", [
    ("1", "formal"), ("3.14", "formal"), ("\u01201", "formal"), ("+", "formal"), ("=", "formal"),
    ("*", "formal"), ("x", "formal"), (" y", "formal"), ("\\sqrt", "formal"), ("\u03c0", "formal"),
    ("\u2211", "formal"), ("<=", "formal"), ("(", "formal"),
    ("therefore", "logical"), (" Because", "logical"), ("\u0120however", "logical"), ("but", "logical"),
    ("First", "logical"), ("next", "logical"), ("finally", "logical"), ("and", "logical"), ("also", "logical"),
    ("so", "logical"), ("if", "logical"), ("then", "logical"),
    ("Wait", "metacognitive"), ("\u2581wait", "metacognitive"), ("Hmm", "metacognitive"),
    ("check", "metacognitive"), ("verify", "metacognitive"), ("Correction", "metacognitive"),
    ("Let's check", "metacognitive"), ("Let\u2019s", "metacognitive"), ("let me", "metacognitive"),
    ("In summary", "metacognitive"), ("First, I will", "metacognitive"),
    ("the", "semantic"), ("is", "semantic"), ("of", "semantic"), ("problem", "semantic"),
    ("solution", "semantic"), ("correct", "semantic"), ("final", "semantic"), ("a", "semantic"),
    ("I", "semantic"), (".", "semantic"), ("\u010a", "semantic"), ("", "semantic"),
])
def test_token_category_examples(token, category):
    assert token_category(token) == category


def test_lexicons_disjoint_and_category_counts():
    assert not (LOGICAL_WORDS & METACOGNITIVE_WORDS)
    counts = category_counts(["Wait", ",", " so", " x", " =", " 3", " the", " answer"])
    assert counts == {"formal": 3, "logical": 1, "metacognitive": 1, "semantic": 3}
    assert category_counts([]) == {"formal": 0, "logical": 0, "metacognitive": 0, "semantic": 0}


def test_cut_after_first_box():
    assert cut_after_first_box("so \\boxed{4}. Done \\boxed{5}") == "so \\boxed{4}"
    # nested braces are matched
    assert cut_after_first_box("\\boxed{\\frac{1}{2}} extra") == "\\boxed{\\frac{1}{2}}"
    # escaped braces do not close the box
    assert cut_after_first_box("\\boxed{\\{1\\}} tail") == "\\boxed{\\{1\\}}"
    # no box or an unclosed box: unchanged
    assert cut_after_first_box("no box here") == "no box here"
    assert cut_after_first_box("\\boxed{4 and on") == "\\boxed{4 and on"


def test_rft_filter_cases():
    assert rft_filter("7 + 12 = 19 so the answer is \\boxed{19}")
    assert not rft_filter("seven plus twelve is nineteen")  # no box (and no digit)
    assert not rft_filter("the answer is \\boxed{nineteen}")  # no digit
    assert not rft_filter("1 \\boxed{19} \\boxed{20}")  # two boxes
    # 3-gram redundancy of "x x x x x x 1 \boxed{1}": trigrams xxx (4 of them), xx1, x1b -> 1 - 3/6 = 0.5 > 0.31
    assert not rft_filter("x x x x x x 1 \\boxed{1}")
    # "a b c a b c 1 \boxed{1}": abc, bca, cab, abc, bc1, c1b -> 1 - 5/6 = 0.1667 <= 0.31
    assert rft_filter("a b c a b c 1 \\boxed{1}")


def test_rft_prepare_cuts_then_filters():
    assert rft_prepare("2 + 2 = \\boxed{4} and also \\boxed{5}") == "2 + 2 = \\boxed{4}"
    assert rft_prepare("2 + 2 = \\boxed{4} x x x x x x x x x x") == "2 + 2 = \\boxed{4}"  # repetition cut away
    assert rft_prepare("no box 4") is None
