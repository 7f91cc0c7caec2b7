"""The update waits for the device once a step, not once per micro-batch: every value computed from the model's
outputs (log-probs, losses, metric sums, the pre-update log-probs) stays a device tensor until the step's summary.

On a GPU each `float(t)`, `t.item()`, `t.tolist()` or `t.cpu()` of a device tensor stalls the host until the
device catches up. This CPU has no device to stall, so the test marks what the model computes: the forward's
outputs become `Watched` tensors, a subclass that every tensor derived from them inherits (PyTorch's
`__torch_function__`), and each host conversion of one is counted. The count must not grow with the micro-batches."""

import pytest
import torch

from relayrl.learner.policy import PolicyLearner
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _config, _experience

HOST_CONVERSIONS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy}
HOST_CONVERSIONS |= {torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__}


class Watched(torch.Tensor):
    conversions = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in HOST_CONVERSIONS:
            Watched.conversions += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def conversions_in_one_update(model_dir, micro_batch: int, extra=()) -> int:
    learner = PolicyLearner(learner_settings(_config(model_dir, extra, micro_batch=micro_batch, mini_batch=16)))
    token_stats = learner._token_stats

    def watched(*args, **kwargs):
        return tuple(t.as_subclass(Watched) for t in token_stats(*args, **kwargs))

    learner._token_stats = watched
    exp = _experience()
    learner.fill_logprobs(exp)
    Watched.conversions = 0
    learner.update(exp)
    return Watched.conversions


@pytest.mark.parametrize("extra", [(), ("algorithm.correction.mode=tis_token",)], ids=["plain", "tis_in_pass"])
def test_the_update_converts_to_the_host_once_a_step_however_many_micro_batches(random_model_dir, extra):
    one = conversions_in_one_update(random_model_dir, micro_batch=16, extra=extra)
    eight = conversions_in_one_update(random_model_dir, micro_batch=2, extra=extra)
    assert eight == one, f"{eight} host conversions with 8 micro-batches, {one} with one: one per micro-batch"
    assert one <= 2
