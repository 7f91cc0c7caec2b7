"""The learner's memory options: `learner.activation_checkpointing` recomputes and changes nothing else;
`learner.offload` values that cannot take effect are config errors naming the key."""

from __future__ import annotations

import pytest
import torch

from relayrl.build import resolve
from relayrl.config import load_config
from relayrl.errors import ConfigError
from relayrl.learner.critic import Critic
from relayrl.learner.policy import PolicyLearner
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _config, _experience

AC = "learner.activation_checkpointing=true"
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2"]


def _grads_of_first_step(learner, exp):
    """The trainable parameters' gradients at the first optimizer step (LoRA: the adapter's), and the stats."""
    captured = []
    trainable = [p for p in learner.model.parameters() if p.requires_grad]
    learner.optimizer.register_step_pre_hook(lambda *_: captured or captured.extend(p.grad.clone() for p in trainable))
    return captured, learner.update(exp).metrics


def _mlp_calls(network) -> list[int]:
    """A counter of MLP forwards in the first decoder layer: a recompute in the backward adds one per pass."""
    calls = [0]
    mlp = next(m for name, m in network.named_modules() if name.endswith("layers.0.mlp"))
    # a pre-hook: the recompute stops early once the last saved tensor is back, before the MLP's forward returns
    mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("extra", [[], LORA], ids=["full", "lora"])
def test_activation_checkpointing_recomputes_and_gives_the_same_loss_and_gradients(random_model_dir, extra):
    plain = PolicyLearner(learner_settings(_config(random_model_dir, extra=extra, micro_batch=8)))
    checked = PolicyLearner(learner_settings(_config(random_model_dir, extra=extra + [AC], micro_batch=8)))
    calls_plain, calls_checked = _mlp_calls(plain.network), _mlp_calls(checked.network)
    grads_plain, stats_plain = _grads_of_first_step(plain, _experience())
    grads_checked, stats_checked = _grads_of_first_step(checked, _experience())
    recomputed = calls_checked[0] - calls_plain[0]
    assert recomputed == stats_checked["learner/micro_batches"] > 1  # each micro-batch's layers ran twice
    assert any(g.abs().sum() > 0 for g in grads_plain)
    for a, b in zip(grads_plain, grads_checked, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert stats_checked["loss/policy"] == pytest.approx(stats_plain["loss/policy"], abs=1e-5)
    dropouts = [m for m in checked.network.modules() if isinstance(m, torch.nn.Dropout)]
    assert not any(m.training for m in dropouts)  # only the layers' own flag is set: dropout stays off


def test_activation_checkpointing_in_the_critic_keeps_its_update(random_model_dir):
    values = []
    for extra in ([], [AC]):
        critic = Critic(
            learner_settings(_config(random_model_dir, extra=["algorithm.advantage=gae", "critic.lr=1e-2"] + extra)),
            "cpu",
        )
        torch.manual_seed(0)  # the value head is zero-initialised; the body is loaded
        exp = _experience(vocab=12)
        exp.values = critic.values(exp)
        exp.returns = exp.rewards[:, None].expand_as(exp.loss_mask) * exp.loss_mask
        critic.update(exp)
        values.append(critic.values(exp))
    assert (values[0] - 0).abs().max() > 1e-4
    torch.testing.assert_close(values[0], values[1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
def test_offload_on_a_cpu_only_run_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="learner.offload=params needs a CUDA device"):
        resolve(load_config(None, ["learner.offload=params"]))  # checked against this machine


def test_optimizer_only_offload_is_refused_with_what_fsdp2_offers():
    with pytest.raises(ConfigError, match="learner.offload=optimizer is not available.*CPUOffloadPolicy"):
        resolve(load_config(None, ["learner.offload=optimizer"]))
    assert resolve(load_config(None, [])).learner.offload == "none"
