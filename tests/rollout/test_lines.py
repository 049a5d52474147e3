"""`explorl.rollout.lines`: where a response's lines begin, against the text itself (the character tokenizer makes
each character one token, so a token begins a line exactly when the character before it is a newline)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.rollout.lines import ends_line_table, line_start_mask


def _encode(tok, texts: list[str], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and mask of `texts`, padded with the pad id on the left (prompts) or the right (responses)."""
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    width = max((len(x) for x in ids), default=0)
    pad = [[tok.pad_token_id] * (width - len(x)) for x in ids]
    rows = [p + x if left else x + p for x, p in zip(ids, pad)]
    masks = [[0] * len(p) + [1] * len(x) if left else [1] * len(x) + [0] * len(p) for x, p in zip(ids, pad)]
    shape = (len(texts), width)
    return torch.tensor(rows, dtype=torch.long).reshape(shape), torch.tensor(masks).reshape(shape)


def _mask(tok, prompts: list[str], responses: list[str]) -> torch.Tensor:
    prompt_ids, prompt_mask = _encode(tok, prompts, left=True)
    response_ids, mask = _encode(tok, responses, left=False)
    return line_start_mask(prompt_ids, prompt_mask, response_ids, mask.float(), ends_line_table(tok))


def test_only_the_newline_ends_a_line_in_the_character_vocabulary(char_tokenizer):
    table = ends_line_table(char_tokenizer)
    newline = char_tokenizer.encode("\n", add_special_tokens=False)
    assert table.shape == (len(char_tokenizer),) and table.dtype == torch.bool
    assert len(newline) == 1 and table.nonzero().flatten().tolist() == newline


def test_line_starts_by_hand(char_tokenizer):
    # "3+4=7\n\boxed{7}" after a prompt ending with a newline: the first token (the first line's) and the 7th, the
    # backslash after "3+4=7\n" (6 characters); after a prompt without one, the 7th only; padding never
    got = _mask(char_tokenizer, ["3+4=?\n", "3+4=?", "1=?\n"], ["3+4=7\n\\boxed{7}", "3+4=7\n\\boxed{7}", "1\n"])
    assert got[0].nonzero().flatten().tolist() == [0, 6]
    assert got[1].nonzero().flatten().tolist() == [6]
    assert got[2].nonzero().flatten().tolist() == [0]  # the token after "1\n" is padding
    assert got.shape == (3, 15) and got.dtype == torch.float32


def test_an_empty_prompt_starts_the_text(char_tokenizer):
    response_ids, mask = _encode(char_tokenizer, ["ab\nc"], left=False)
    table = ends_line_table(char_tokenizer)
    none = torch.zeros(1, 0, dtype=torch.long)
    assert line_start_mask(none, none, response_ids, mask.float(), table).tolist() == [[1.0, 0.0, 0.0, 1.0]]
    padded = torch.full((1, 2), char_tokenizer.pad_token_id)  # a prompt of padding only
    assert line_start_mask(padded, torch.zeros(1, 2), response_ids, mask.float(), table)[0, 0] == 1.0


def test_mismatched_shapes_are_refused(char_tokenizer):
    with pytest.raises(ValueError, match="line_start_mask: expected prompt_ids"):
        line_start_mask(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), torch.zeros(3, 4, dtype=torch.long),
                        torch.ones(3, 4), ends_line_table(char_tokenizer))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text("12+=?\n", max_size=6), st.text("0123456789-+=\n", min_size=1, max_size=12)),
                min_size=1, max_size=4))
def test_line_starts_follow_the_newlines_of_the_text(char_tokenizer, pairs):
    prompts, responses = [p for p, _ in pairs], [r for _, r in pairs]
    got = _mask(char_tokenizer, prompts, responses)
    for row, (prompt, response) in enumerate(pairs):
        text = prompt + response
        want = [float(len(prompt) + i == 0 or text[len(prompt) + i - 1] == "\n") for i in range(len(response))]
        assert got[row, :len(response)].tolist() == want
        assert not got[row, len(response):].any()
