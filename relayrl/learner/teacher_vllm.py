"""`teacher.engine: vllm`: the teacher's log-probs through a vLLM engine of its own (vLLM's `prompt_logprobs`, every
row of a batch in one call), in the teacher's own Ray actor under `placement.mode: ray` (relayrl/learner/
teacher_role.py), or in the driver beside the rollout engine on a CPU machine under `placement.mode: local`.

vLLM's prompt log-probs skip the sampling processors: they are at temperature 1 and untruncated, so this engine
needs `rollout.temperature: 1` (the config refuses another, naming both keys); untruncated is what the local engine
scores too. The log-probs land in the local engine's columns (`response_targets`: the positions that predict a
response token, 0 elsewhere), so the signal, masks and `teacher.prompt` alignment are the same. One teacher
(`teacher.path`) only; several routed teachers are refused at config load. Precision: vLLM's kernels, not the
learner's forward: on CPU (fp32) they agree with the local engine within the tolerance
tests/integration/test_teacher_vllm.py measures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from relayrl.learner.layout import response_targets

if TYPE_CHECKING:
    from relayrl.learner.settings import TeacherSettings
    from relayrl.rollout.vllm_engine import VLLMEngine
    from relayrl.types import Experience

TEACHER_ROLE = "the teacher's vLLM engine (teacher.engine=vllm)"
OWN_GPU_SHARE = 0.85  # of the teacher actor's own GPU (placement.mode=ray): nothing else runs there


class VLLMTeacher:
    """The teacher behind a vLLM engine: `logprobs(exp)` as `Teachers.logprobs` gives them."""

    def __init__(self, engine: VLLMEngine):
        self.engine = engine

    @classmethod
    def start(cls, settings: TeacherSettings, max_model_len: int, cores: str | None = None) -> VLLMTeacher:
        """The teacher's own vLLM engine (`teacher.dtype`; the rollout section's KV cache, prefix caching, eager
        mode and model runner), on `OWN_GPU_SHARE` of its GPU; `max_model_len`: the longest row it scores."""
        from relayrl.rollout.build import EngineDevice
        from relayrl.rollout.vllm_engine import VLLMEngine

        (entry,) = settings.teacher.models()  # config load refuses several teachers with this engine
        rollout = settings.rollout
        engine = VLLMEngine(
            entry.path,
            max_model_len + 1,  # the one token vLLM generates after a scored row of max_model_len
            settings.train.seed,
            kv_cache_gib=rollout.kv_cache_gib,
            gpu_memory_utilization=OWN_GPU_SHARE,
            prefix_caching=rollout.prefix_caching,
            cores=cores,
            device=EngineDevice.resolve(entry.dtype, rollout.enforce_eager, "off", rollout.model_runner),
            role=TEACHER_ROLE,
        )
        return cls(engine)

    def logprobs(self, exp: Experience) -> torch.Tensor:
        """The teacher's log-probs of the response tokens [B, T-1] (0 off them), every row in one vLLM call."""
        lengths = exp.attention_mask.sum(dim=1).tolist()  # right-padded rows
        rows = [exp.input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        scored = self.engine.prompt_logprobs_batch(rows)
        full = torch.zeros_like(exp.loss_mask)
        for i, values in enumerate(scored):
            full[i, : len(values)] = torch.tensor(values, dtype=full.dtype)
        out = torch.zeros_like(exp.loss_mask)
        sample, column = response_targets(exp)
        out[sample, column] = full[sample, column]
        return out

    def score(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience:
        """`exp` with `teacher_logprobs` filled, as `Teachers.score` (`teacher_rows`: with `teacher.prompt`)."""
        from relayrl.algorithms.teacher_prompt import align_to_student

        if teacher_rows is None:
            exp.teacher_logprobs = self.logprobs(exp)
            return exp
        exp.teacher_logprobs = align_to_student(self.logprobs(teacher_rows), teacher_rows, exp)
        return exp
