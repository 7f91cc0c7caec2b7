"""`teacher.prompt`: the prompt the teacher sees instead of the student's (context distillation), and the exact
alignment of the teacher's log-probs with the student's tokens.

The template is a Python format string: `{prompt}` is the student's prompt text (as rendered for the student), and
`{name}` the value of a column of the prompt's data row. relayrl/config/teacher.py refuses, at config load, a template that
does not parse or whose placeholder is not a plain name; `TeacherPrompt.check_prompts` refuses, at data load, a
placeholder no row column answers, naming `teacher.prompt`, the placeholder and the row.

The teacher's rows are the student's with the prompt's token ids replaced: `TeacherPrompt.rollouts` tokenizes the
rendered template, and relayrl/learner/teacher.py's `teacher_experience` appends the student's response ids as they are (ids, never text, so the response is token for
token the one the student sampled; multi-turn observations travel with it, masked as before). `align_to_student`
moves the teacher's per-token log-probs from its rows' columns to the student's: response token k sits at column
`prompt_length - 1 + k` in each layout. A response that differs between the two rows is a bug, named there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from relayrl.config.teacher import STUDENT_PROMPT, template_fields
from relayrl.errors import DataError

if TYPE_CHECKING:
    from relayrl.types import Experience, Prompt, Rollout


@dataclass(frozen=True)
class TeacherPrompt:
    """The `teacher.prompt` template and the student's tokenizer (the teacher has the same vocabulary)."""

    template: str
    tokenizer: Any

    def check_prompts(self, prompts: list[Prompt]) -> None:
        """Data load (data.train read whole): each row answers every placeholder, else a DataError naming it."""
        for prompt in prompts:
            self.render(prompt, f"data.train row {prompt.id}")

    def render(self, prompt: Prompt, where: str) -> str:
        """The teacher's prompt text for one row; `where` names the row or sample in a refusal."""
        values = {**prompt.columns, STUDENT_PROMPT: prompt.text}
        missing = [name for name in template_fields(self.template) if name not in values]
        if missing:
            raise DataError(
                f"teacher.prompt: placeholder {{{missing[0]}}} is neither {{prompt}} nor a column of {where} "
                f"(its columns: {', '.join(sorted(prompt.columns)) or 'none'})"
            )
        return self.template.format(**values)

    def token_ids(self, prompt: Prompt, where: str) -> list[int]:
        """The teacher's prompt tokens: a plain prompt gets the tokenizer's special tokens (e.g. BOS), as the
        student's does; a chat row's template text carries its own."""
        if prompt.images:
            raise DataError(f"teacher.prompt: {where} has images; a teacher's own prompt with images is not supported")
        text = self.render(prompt, where)
        return self.tokenizer(text, add_special_tokens=prompt.messages is None)["input_ids"]

    def rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        """The student's rollouts with the teacher's prompt: each prompt row rendered once, responses untouched."""
        prompts: dict[int, Prompt] = {}
        out = []
        for rollout in rollouts:
            key = id(rollout.prompt)
            if key not in prompts:
                ids = self.token_ids(rollout.prompt, f"sample {rollout.sample_id}")
                prompts[key] = dataclasses.replace(rollout.prompt, token_ids=ids, engine_token_ids=None)
            out.append(dataclasses.replace(rollout, prompt=prompts[key]))
        return out


def response_spans(exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt length and response length [B] (from `prompt_lengths` and the attention mask)."""
    if exp.prompt_lengths is None:
        raise RuntimeError("aligning the teacher's prompt needs Experience.prompt_lengths (make_experience sets them)")
    return exp.prompt_lengths, exp.attention_mask.sum(dim=1) - exp.prompt_lengths


def align_to_student(teacher_logprobs: torch.Tensor, teacher: Experience, student: Experience) -> torch.Tensor:
    """The teacher's log-probs [B, T_teacher-1] of its rows moved to the student's columns [B, T_student-1] (0 off
    the responses): response token k at column prompt_length - 1 + k in each. The responses must be the same token ids."""
    t_prompt, t_response = response_spans(teacher)
    s_prompt, s_response = response_spans(student)
    out = torch.zeros_like(student.loss_mask)
    for row in range(len(student)):
        n, t0, s0 = int(s_response[row]), int(t_prompt[row]), int(s_prompt[row])
        same = int(t_response[row]) == n and torch.equal(
            teacher.input_ids[row, t0 : t0 + n], student.input_ids[row, s0 : s0 + n]
        )
        if not same:
            raise RuntimeError(f"row {row}: the teacher's response tokens are not the student's (teacher.prompt)")
        out[row, s0 - 1 : s0 - 1 + n] = teacher_logprobs[row, t0 - 1 : t0 - 1 + n]
    return out
