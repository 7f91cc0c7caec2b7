"""`relayrl plan plan.measure=true`: the learner's fixed costs, apart from the model's FLOPs and the optimizer's bytes.

relayrl's own `PolicyLearner` updates a null model (one layer, hidden 64, so its FLOPs are negligible; the
layers' own work is timed at the run's width by relayrl/planner/pass_probe.py) on 8 samples of 4 + 4 tokens,
once as one micro-batch and once as eight. The difference over 7 is what a micro-batch costs beyond its FLOPs
(the model's Python per call, the loss, the log-prob gathering, the metrics), the rest what an update costs
beyond its micro-batches (clipping, the optimizer and scheduler calls, the loop, the mismatch statistics). Left out: the optimizer's Python per tensor beyond the null
model's (its bytes are counted at the memory bandwidth).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

SAMPLES, PROMPT, RESPONSE = 8, 4, 4


@dataclass(frozen=True)
class LearnerOverhead:
    """Seconds the learner spends apart from the model's FLOPs and the optimizer's bytes (null model)."""

    per_update: float  # one optimizer step's fixed work
    per_micro_batch: float  # one micro-batch's forward + backward's fixed work


def probe_update_here(model_dir: str, repeats: int = 5) -> LearnerOverhead:
    one = _best_update(model_dir, SAMPLES, repeats)
    eight = _best_update(model_dir, 1, repeats)
    per_micro_batch = max(0.0, (eight - one) / (SAMPLES - 1))
    return LearnerOverhead(max(0.0, one - per_micro_batch), per_micro_batch)


def _best_update(model_dir: str, micro_batch: int, repeats: int) -> float:
    """Best seconds of one `PolicyLearner.update` on the null model, after one to warm up."""
    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.config import load_config
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.placement.sections import learner_settings
    from relayrl.types import Prompt, Rollout, Score

    overrides = [f"model.path={model_dir}", f"rollout.n={SAMPLES}", "rollout.prompts_per_step=1"]
    learner = PolicyLearner(learner_settings(load_config(None, overrides + [f"train.micro_batch={micro_batch}"])))
    prompt = Prompt(id="0", text="", token_ids=[5] * PROMPT)
    rollouts = [
        Rollout(prompt, i, [6 + i] * RESPONSE, "", [-1.0] * RESPONSE, "stop", [0] * RESPONSE) for i in range(SAMPLES)
    ]
    exp = make_experience(rollouts, [Score(float(i % 2)) for i in range(SAMPLES)], pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    learner.update(exp)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        learner.update(exp)
        best = min(best, time.perf_counter() - start)
    return best
