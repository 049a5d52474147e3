"""Text measures of responses: quality issues, token categories and RFT data filters (STILL; docs/methods.md §8c).

Quality issues (STILL, section 3.1, Figure 3(d)): `format_issue` (no `\\boxed{` or more than one),
`repetition_issue` (n-gram redundancy above a threshold; the paper judges "irrelevant content" with an LLM,
explorl (docs/methods.md §8c) uses the 3-gram redundancy of the RFT filter instead), `language_mixing` (Chinese
characters), `quality_report` (fractions over a set of responses).

Token categories (STILL, section 3.3, Table 1): `token_category` and `category_counts` with the lexicons
below, which are explorl's reading of Table 1's examples.

RFT rule-based filters (STILL, section 4.4.1): `cut_after_first_box`, `rft_filter`, `rft_prepare`.

No regular expression here can backtrack: the only pattern is a character class.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from explorl.rewards import closing_brace

__all__ = [
    "BOX", "format_issue", "ngram_redundancy", "repetition_issue", "language_mixing", "quality_report",
    "FORMAL_SYMBOLS", "LOGICAL_WORDS", "METACOGNITIVE_WORDS", "CATEGORIES", "token_category", "category_counts",
    "cut_after_first_box", "rft_filter", "rft_prepare", "REDUNDANCY_THRESHOLD",
]

BOX = "\\boxed{"
"""The answer marker counted by the format check and the RFT filters."""

REDUNDANCY_THRESHOLD = 0.31
"""STILL, section 4.4.1: responses whose 3-gram redundancy exceeds 0.31 are dropped."""

# CJK Unified Ideographs, Extension A, Compatibility Ideographs, Extensions B-F (the Han / Chinese characters).
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]")


# --- quality issues ---------------------------------------------------------------------------------------------

def format_issue(text: str) -> bool:
    """True when the response has no `\\boxed{` or more than one (STILL, section 3.1: the paper counts the
    occurrences of "\\boxed{" in the response string)."""
    return text.count(BOX) != 1


def ngram_redundancy(text: str, n: int = 3, *, level: str = "word") -> float:
    """n-gram redundancy, `1 - (distinct n-grams) / (total n-grams)`.

    STILL (section 4.4.1) uses a "3-gram redundancy" with threshold 0.31 without spelling it out; this is
    explorl's reading: the fraction of n-gram occurrences that repeat an earlier one. "a b c a b c" has the
    3-grams abc, bca, cab, abc: 1 - 3/4 = 0.25. A text with fewer than n units has no n-grams and redundancy 0.

    Args:
        text: the response.
        n: n-gram length (>= 1).
        level: "word" (units are the whitespace-separated tokens, `text.split()`) or "char" (units are the
            characters, whitespace included; for character-level models such as explorl's tiny model).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if level == "word":
        units: list[str] | str = text.split()
    elif level == "char":
        units = text
    else:
        raise ValueError(f"level must be 'word' or 'char', got {level!r}")
    total = len(units) - n + 1
    if total <= 0:
        return 0.0
    distinct = {tuple(units[i:i + n]) for i in range(total)}
    return 1.0 - len(distinct) / total


def repetition_issue(text: str, threshold: float = REDUNDANCY_THRESHOLD, *, n: int = 3, level: str = "word") -> bool:
    """True when `ngram_redundancy(text, n, level=level)` exceeds `threshold` (strictly)."""
    return ngram_redundancy(text, n, level=level) > threshold


def language_mixing(text: str) -> bool:
    """True when the text contains a Chinese (CJK unified / compatibility) ideograph (STILL, section 3.1: a
    regular expression on the Unicode range of Chinese characters). Kana and Hangul do not count."""
    return _CJK.search(text) is not None


def quality_report(texts: Iterable[str], *, threshold: float = REDUNDANCY_THRESHOLD, level: str = "word") -> dict:
    """Fractions of responses with each quality issue (STILL, Figure 3(d)).

    Returns:
        `{"n": int, "format": float, "repetition": float, "language_mixing": float, "any": float}`, `any` being
        the fraction with at least one issue.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("quality_report: no texts")
    counts = {"format": 0, "repetition": 0, "language_mixing": 0, "any": 0}
    for t in texts:
        flags = {
            "format": format_issue(t),
            "repetition": repetition_issue(t, threshold, level=level),
            "language_mixing": language_mixing(t),
        }
        flags["any"] = any(flags.values())
        for k, v in flags.items():
            counts[k] += v
    return {"n": len(texts), **{k: v / len(texts) for k, v in counts.items()}}


# --- token categories -------------------------------------------------------------------------------------------
# explorl's reading of STILL, Table 1. Its examples: formal reasoning = numbers ('1', '3.14'), operators ('+',
# '*', '='), variables ('x', 'y'), symbols ('pi', 'sqrt 2', 'sum'); logical structuring = causal ('therefore',
# 'because'), contrastive ('however', 'but'), progressive ('first', 'next', 'finally'), parallel ('and', 'also');
# metacognitive = verifying ("Let's check"), revising ('Correction', 'Wait'), summarizing ('In summary'), planning
# ('First, I will'); semantic support = everything else (grammar words, domain entities, adjectives such as
# 'correct', 'final'). The lexicons are disjoint; 'first' is logical (progressive) as a word and metacognitive
# only inside the phrase "first, I will".

CATEGORIES = ("formal", "logical", "metacognitive", "semantic")

FORMAL_SYMBOLS = frozenset("+-*/=<>^_|!%()[]{}\u00d7\u00f7\u00b7\u00b1\u2213\u2264\u2265\u2260\u2248\u2261\u221d"
                           "\u221a\u2211\u220f\u222b\u221e\u2202\u2207\u2208\u2209\u2229\u222a\u2282\u2286\u2200"
                           "\u2203\u2192\u21d2\u21d4\u00b0\u2032\u22c5\u2218")
"""Operators, relations, brackets and mathematical symbols (ASCII and Unicode: x, /, +-, <=, >=, !=, ~=, sqrt,
sum, prod, integral, infinity, partial, nabla, set and logic symbols, arrows, degree, prime)."""

LOGICAL_WORDS = frozenset({
    # causal / consequence
    "therefore", "thus", "hence", "so", "because", "since", "consequently", "accordingly", "implies", "thereby",
    # conditional
    "if", "then", "otherwise", "unless",
    # contrastive
    "however", "but", "although", "though", "whereas", "yet", "instead", "nevertheless", "nonetheless",
    # progressive
    "first", "firstly", "second", "secondly", "third", "thirdly", "next", "finally", "lastly",
    # parallel / additive
    "and", "also", "moreover", "furthermore", "additionally", "besides", "similarly", "or",
})
"""Logical-structuring words (lower case)."""

METACOGNITIVE_WORDS = frozenset({
    # verifying
    "check", "checking", "verify", "verifying", "verification", "recheck", "double-check", "confirm",
    # "let me ..." arrives as the tokens 'let' + ' me', so 'let' is here (and 'Let x be' counts too)
    "let", "let's", "lets", "let me", "let's check", "let me check", "let me verify", "double check",
    # revising
    "wait", "hmm", "hm", "hmmm", "correction", "actually", "oops", "mistake", "reconsider", "revisit",
    "alternatively", "perhaps", "maybe",
    # summarizing
    "summary", "summarize", "summarizing", "recap", "in summary", "to summarize", "in conclusion",
    # planning
    "plan", "first, i will", "i will", "i need to", "let me think", "think",
})
"""Metacognitive words and phrases (lower case, single spaces)."""

_MARKERS = str.maketrans({"\u0120": " ", "\u2581": " ", "\u010a": " ", "\u2019": "'", "\u2018": "'"})
_STRIP = " \t\r\n.,;:!?\"'`()[]{}-"  # punctuation stripped from the ends of a word before the lexicon look-up


def _is_formal(s: str) -> bool:
    if any(ch.isdigit() for ch in s):
        return True  # numerals: '1', '3.14', '2x'
    if s.startswith("\\") and len(s) > 1 and s[1:].isalpha():
        return True  # LaTeX commands: \sqrt, \sum, \pi, \frac
    if any(ch in FORMAL_SYMBOLS for ch in s) and all(ch in FORMAL_SYMBOLS or ch in ".," for ch in s):
        return True  # operators and symbols: '+', '=', '<=', '(', ')^'
    v = s.strip(".,;:")  # 'x,' and 'y.' are still variables
    if len(v) == 1 and v.isalpha():
        if "GREEK" in unicodedata.name(v, ""):
            return True  # pi, theta, ...
        return v.isascii() and v not in "aAI"  # single-letter variables x, y, n; not the words 'a', 'I'
    return False


def token_category(token: str) -> str:
    """Category of a token or short phrase: "formal", "logical", "metacognitive" or "semantic".

    The token is normalised first: byte-level BPE and sentencepiece space / newline markers (the characters
    U+0120, U+2581, U+010A) become spaces, curly apostrophes straight ones, and surrounding whitespace is removed.
    Then, in order: formal if it contains a digit, is a LaTeX command, consists of `FORMAL_SYMBOLS` (with '.'
    and ','), or is a single Greek letter or a single Latin letter other than 'a', 'A', 'I'; otherwise it is
    lower-cased, end punctuation is stripped and internal whitespace collapsed, and it is metacognitive if in
    `METACOGNITIVE_WORDS`, logical if in `LOGICAL_WORDS`; a multi-word string not found as a phrase is
    classified by its first word; anything else (including empty and punctuation-only tokens) is semantic.
    """
    s = token.translate(_MARKERS).strip()
    if not s:
        return "semantic"
    if _is_formal(s):
        return "formal"
    words = s.lower().strip(_STRIP).split()
    if not words:
        return "semantic"
    phrase = " ".join(words)
    for key in (phrase, words[0].strip(_STRIP)):
        if key in METACOGNITIVE_WORDS:
            return "metacognitive"
        if key in LOGICAL_WORDS:
            return "logical"
    return "semantic"


def category_counts(tokens: Iterable[str]) -> dict[str, int]:
    """Number of tokens in each category: `{"formal": int, "logical": int, "metacognitive": int, "semantic": int}`
    (all four keys, zeros included)."""
    counts = dict.fromkeys(CATEGORIES, 0)
    for t in tokens:
        counts[token_category(t)] += 1
    return counts


# --- RFT data selection filters (STILL, section 4.4.1) -----------------------------------------------------

def cut_after_first_box(text: str) -> str:
    """The text up to and including the closing brace of its first `\\boxed{...}` (STILL, section 4.4.1:
    "removing any content that followed the first \\boxed marker").

    Braces are matched with nesting; a backslash escapes the next character, so `\\{` and `\\}` do not count.
    A text without `\\boxed{`, or whose first box is never closed, is returned unchanged.
    """
    start = text.find(BOX)
    if start < 0:
        return text
    end = closing_brace(text, start + len(BOX))
    return text[:end + 1] if end >= 0 else text


def rft_filter(text: str, *, threshold: float = REDUNDANCY_THRESHOLD, level: str = "word") -> bool:
    """STILL's rule-based RFT filters (section 4.4.1) on a response as given: True (keep) when it has exactly
    one `\\boxed{`, at least one ASCII digit, and 3-gram redundancy <= `threshold`.

    The paper cuts the response after its first box before checking redundancy; `rft_prepare` does both.
    """
    return (
        text.count(BOX) == 1
        and any("0" <= ch <= "9" for ch in text)
        and ngram_redundancy(text, 3, level=level) <= threshold
    )


def rft_prepare(text: str, *, threshold: float = REDUNDANCY_THRESHOLD, level: str = "word") -> str | None:
    """The paper's RFT pipeline for one response: `cut_after_first_box`, then `rft_filter` on the cut text.

    Returns the cut text if kept, else None. A response with several boxes is kept when the cut text (which has
    one) passes, as in the paper (box presence, then truncation).
    """
    cut = cut_after_first_box(text)
    return cut if rft_filter(cut, threshold=threshold, level=level) else None
