"""Prompts through the tokenizer's chat template (`task.chat_template`, `task.system_prompt`).

Instruct and reasoning models are prompted through their chat template: the problem's messages (a conversational
dataset row) or its templated question as one user message, after an optional system message, rendered with
`apply_chat_template(..., add_generation_prompt=True)` to text and tokenized without adding special tokens again
(the template writes its own), as TRL does. `auto` turns it on when the tokenizer has a template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig
    from explorl.tasks.base import Problem


def resolve_chat_template(setting: str, tokenizer) -> bool:
    """Whether prompts go through the chat template: `on`, `off`, or `auto` (on when the tokenizer has one)."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if setting == "on" and not has:
        raise ValueError("task.chat_template=on, but the tokenizer defines no chat template; use off (or auto), or "
                         "a model directory whose tokenizer_config.json has one")
    return has if setting == "auto" else setting == "on"


def messages_of(problem: Problem, system_prompt: str = "") -> list[dict]:
    """The chat messages of a problem: its own (a conversational row) or its prompt as one user message, with
    `system_prompt` first unless the messages already start with a system message."""
    messages = list(problem.messages) if problem.messages else [{"role": "user", "content": problem.prompt}]
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def prompt_text(problem: Problem, tokenizer, *, chat: bool, system_prompt: str = "") -> str:
    """The exact text the model is prompted with."""
    if chat:
        return tokenizer.apply_chat_template(messages_of(problem, system_prompt), add_generation_prompt=True,
                                             tokenize=False)
    if problem.messages:
        raise ValueError(f"problem {problem.meta.get('id', '?')} holds chat messages, but task.chat_template is off "
                         "(or auto with a tokenizer that has no template): set task.chat_template: on with a "
                         "tokenizer that defines one, or give the question as text")
    if system_prompt:
        return f"{system_prompt}\n\n{problem.prompt}"
    return problem.prompt


def prompt_encoder(tokenizer, task_cfg: TaskConfig) -> Callable[[Problem], list[int]]:
    """`fn(problem) -> prompt token ids` as `task_cfg` asks (chat template resolved once, here)."""
    chat = resolve_chat_template(task_cfg.chat_template, tokenizer)

    def encode(problem: Problem) -> list[int]:
        text = prompt_text(problem, tokenizer, chat=chat, system_prompt=task_cfg.system_prompt)
        return tokenizer.encode(text, add_special_tokens=False)

    encode.chat = chat  # type: ignore[attr-defined]  (what `auto` resolved to, for the run's config)
    return encode
