"""Analysis of rollouts: exploration measures (`measures`) and text measures (`text`); STILL, docs/methods.md §8.
"""

from explorl.analysis.measures import (
    answer_diversity,
    entropy_by_position,
    entropy_performance_fit,
    entropy_split,
    mean_answer_diversity,
    response_perplexity,
    set_overlaps,
    unsolvable_set,
)
from explorl.analysis.text import (
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

__all__ = [
    "unsolvable_set", "set_overlaps", "entropy_by_position", "entropy_split", "response_perplexity",
    "answer_diversity", "mean_answer_diversity", "entropy_performance_fit",
    "format_issue", "ngram_redundancy", "repetition_issue", "language_mixing", "quality_report",
    "token_category", "category_counts", "cut_after_first_box", "rft_filter", "rft_prepare",
]
