"""Log-probs and entropies from hidden states a chunk at a time (relayrl/learner/token_stats.py): the same
values and gradients as from full logits, and a model whose logits are more than its head is stopped."""

import pytest
import torch

from relayrl.errors import ConfigError
from relayrl.learner.policy import PolicyLearner
from relayrl.learner.token_stats import head_stats, logits_stats
from relayrl.placement.sections import learner_settings
from tests.unit.test_learner import _config, _experience, _grads_of_first_step


@pytest.mark.parametrize("top_k,top_p,entropy_grad", [(-1, 1.0, False), (5, 1.0, True), (-1, 0.8, True)])
def test_chunks_give_the_values_and_gradients_of_one_piece(top_k, top_p, entropy_grad):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 8, generator=gen)
    head = torch.nn.Linear(8, 11, bias=False)
    targets = torch.randint(0, 11, (37,), generator=gen)
    results = []
    for chunk in (0, 5):
        h = hidden.clone().requires_grad_()
        head.zero_grad()
        logp, entropy = head_stats(h, head, targets, 0.7, top_k, top_p, chunk, entropy_grad)
        # keep only finite log-probs (a target outside top-k/top-p has -inf)
        loss = logp[logp.isfinite()].sum() + (entropy.sum() if entropy_grad else 0)
        loss.backward()
        results.append((logp.detach(), entropy.detach(), h.grad.clone(), head.weight.grad.clone()))
        assert entropy.requires_grad == entropy_grad
    for whole, chunked in zip(*results):
        torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-5)
    direct = logits_stats(hidden @ head.weight.T, targets, 0.7, top_k, top_p, False)
    torch.testing.assert_close(results[0][0], direct[0])


@pytest.mark.parametrize("logits_chunk", [0, 3])
def test_the_head_over_hidden_states_trains_as_the_models_logits(random_model_dir, logits_chunk):
    runs = {}
    for chunk in (logits_chunk, 1024):
        learner = PolicyLearner(
            learner_settings(
                _config(
                    random_model_dir,
                    micro_batch=8,
                    logits_chunk=chunk,
                    extra=["algorithm.entropy_coef=0.01", "rollout.temperature=0.7"],
                )
            )
        )
        runs[chunk] = _grads_of_first_step(learner, _experience())
    (grads_a, stats_a), (grads_b, stats_b) = runs.values()
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    assert stats_a.metrics["actor/entropy"] == pytest.approx(stats_b.metrics["actor/entropy"], rel=1e-5)
    assert stats_a.metrics["loss/total"] == pytest.approx(stats_b.metrics["loss/total"], abs=1e-6)


def test_a_model_whose_logits_are_not_its_head_is_stopped_with_one_message(random_model_dir):
    learner = PolicyLearner(learner_settings(_config(random_model_dir, packing="none")))
    forward = learner.model.forward

    def soft_capped(*args, **kwargs):  # as Gemma-2's final logit soft-capping would
        out = forward(*args, **kwargs)
        out.logits = 5 * torch.tanh(out.logits / 5)
        return out

    learner.model.forward = soft_capped
    with pytest.raises(
        ConfigError,
        match=r"padded rows, head over hidden states\) gives log-probs up to .* "
        r"Set train.logits_chunk=0\.$",
    ):
        learner.update(_experience())


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_log_probs_and_entropy_come_from_one_pass_over_the_vocabulary(monkeypatch, entropy_grad):
    """One log-softmax per call (there was a logsumexp for the log-probs and a second log-softmax for the
    entropy), with the values and gradients of the two-pass formulas."""
    from tests.reference import entropy_from_logits, token_logprobs

    gen = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(9, 13, generator=gen), torch.randint(0, 13, (9,), generator=gen)
    passes = []
    for name in ("log_softmax", "logsumexp", "softmax"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _f=original, _n=name, **k: passes.append(_n) or _f(*a, **k))
    ours = logits.clone().requires_grad_()
    logp, entropy = logits_stats(ours, targets, 0.7, 5, 1.0, entropy_grad)
    assert passes == ["log_softmax"]
    monkeypatch.undo()
    ref = logits.clone().requires_grad_()
    masked = torch.where(ref / 0.7 >= (ref / 0.7).topk(5, dim=-1).values[:, -1:], ref / 0.7, float("-inf"))
    ref_logp, ref_entropy = token_logprobs(masked, targets), entropy_from_logits(masked)
    finite = ref_logp.isfinite()
    torch.testing.assert_close(logp[finite], ref_logp[finite])
    torch.testing.assert_close(entropy, ref_entropy)
    (logp[finite].sum() + (entropy.sum() if entropy_grad else 0)).backward()
    (ref_logp[finite].sum() + (ref_entropy.sum() if entropy_grad else 0)).backward()
    torch.testing.assert_close(ours.grad, ref.grad)


@pytest.mark.parametrize("chunk", [0, 4])
def test_a_suppressed_target_reads_zero_and_keeps_gradients_finite(chunk):
    """An image token shown in a multi-turn observation is a target the distribution leaves out (a vision-language
    model's placeholders are never sampled): its log-prob reads 0, not -inf, so the ratio exp(logp - old) of an
    untrained position is 1, not nan, and the backward stays finite (a nan there poisoned every weight)."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 8, generator=gen, requires_grad=True)
    head = torch.nn.Linear(8, 11, bias=False)
    targets = torch.tensor([1, 10, 2, 9, 10, 3, 4, 9, 5])  # 9 and 10 are suppressed
    logp, _ = head_stats(hidden, head, targets, 1.0, -1, 1.0, chunk, False, (9, 10))
    suppressed = (targets >= 9).nonzero().flatten()
    assert torch.equal(logp[suppressed], torch.zeros(len(suppressed)))
    assert logp.isfinite().all() and (logp[targets < 9] < 0).all()
    old = logp.detach()
    mask = (targets < 9).float()
    (torch.exp(logp - old) * mask).sum().backward()
    assert hidden.grad is not None and hidden.grad.isfinite().all() and head.weight.grad.isfinite().all()
