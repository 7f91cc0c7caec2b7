"""The top-k / top-p sampling mask, by hand and against vLLM's own reference implementation."""

import math

import pytest
import torch

from relayrl.algorithms import sampling_mask
from relayrl.algorithms.sampling_mask import truncate_logits

INF = float("inf")


def test_top_k_by_hand():
    logits = torch.tensor([[[1.0, 3.0, 2.0, 0.5, 2.5]]])  # [B=1, T=1, V=5]
    kept = truncate_logits(logits, top_k=2, top_p=1.0)
    assert kept.flatten().tolist() == [-INF, 3.0, -INF, -INF, 2.5]  # the two largest logits
    # renormalised over the two: softmax of (3, 2.5)
    p3 = 1 / (1 + math.exp(-0.5))
    assert torch.log_softmax(kept, -1).exp().flatten().tolist() == pytest.approx([0, p3, 0, 0, 1 - p3], abs=1e-6)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # descending: 0.5 (mass before it 0), 0.3 (0.5 < 0.7: kept), 0.1 (0.8 >= 0.7: dropped), 0.1 (dropped)
    logits = torch.log(torch.tensor([[[0.1, 0.5, 0.1, 0.3]]]))
    kept = truncate_logits(logits, top_k=-1, top_p=0.7)
    assert torch.isfinite(kept).flatten().tolist() == [False, True, False, True]
    probs = torch.log_softmax(kept, -1).exp().flatten().tolist()
    assert probs == pytest.approx([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8], abs=1e-6)


def test_top_p_always_keeps_the_top_token():
    logits = torch.log(torch.tensor([[0.9, 0.05, 0.05]]))
    assert torch.isfinite(truncate_logits(logits, 0, 0.01)).tolist() == [[True, False, False]]


def test_top_p_is_measured_after_top_k_renormalises():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # top-k 3 renormalises to 0.4/0.9, 0.3/0.9, 0.2/0.9 = 0.444, 0.333, 0.222; the mass before 0.222 is
    # 0.778 >= 0.75, so it is dropped (on the raw probabilities it would be 0.7 < 0.75 and kept)
    kept = truncate_logits(logits, top_k=3, top_p=0.75)
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]


def test_off_leaves_logits_unchanged():
    logits = torch.randn(2, 3, 7)
    assert truncate_logits(logits, top_k=-1, top_p=1.0) is logits
    assert truncate_logits(logits, top_k=0, top_p=1.0) is logits
    assert torch.equal(truncate_logits(logits, top_k=7, top_p=1.0), logits)  # k >= vocab keeps everything


def test_truncated_distribution_is_normalised_and_differentiable():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 50, requires_grad=True)
    before = logits.detach().clone()
    kept = truncate_logits(logits, top_k=10, top_p=0.9)
    assert torch.equal(logits.detach(), before)  # the input is not modified
    probs = torch.log_softmax(kept, -1).exp()
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3), atol=1e-6)
    survivors = torch.isfinite(kept).sum(-1)
    assert (survivors >= 1).all() and (survivors <= 10).all()
    torch.log_softmax(kept, -1)[..., 0].sum().backward()
    assert (logits.grad[~torch.isfinite(kept)] == 0).all()  # dropped tokens get no gradient


def test_row_chunks_do_not_change_the_result(monkeypatch):
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 20)
    whole = truncate_logits(logits, top_k=-1, top_p=0.8)
    monkeypatch.setattr(sampling_mask, "ROW_CHUNK_ELEMENTS", 40)  # two rows per chunk
    assert torch.equal(truncate_logits(logits, top_k=-1, top_p=0.8), whole)


def test_bad_top_p_is_an_error():
    with pytest.raises(ValueError, match="top_p"):
        truncate_logits(torch.zeros(1, 3), top_k=-1, top_p=0.0)


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (-1, 0.9), (-1, 0.5), (20, 0.95), (3, 0.3)])
def test_matches_vllms_pytorch_sampler(top_k, top_p):
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    torch.manual_seed(2)
    logits = 3 * torch.randn(64, 100)  # peaked enough that top-p keeps a few tokens, not half the vocab
    k = torch.full((64,), top_k, dtype=torch.int32) if top_k > 0 else None
    p = torch.full((64,), top_p, dtype=torch.float32) if top_p < 1 else None
    expected = ops.apply_top_k_top_p_pytorch(logits.clone(), k, p)
    assert torch.equal(torch.isfinite(truncate_logits(logits, top_k, top_p)), torch.isfinite(expected))
