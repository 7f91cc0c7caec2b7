"""The HF engine's own sampling loop (`HFEngine._decode`) against transformers `generate`: the same tokens and the
same processed log-probs, bit for bit, for each kind of sampling setting the engine passes on."""

import pytest
import torch

from relayrl.rollout.hf_engine import HFEngine
from relayrl.types import Sampling

SETTINGS = [
    Sampling(n=8, temperature=1.0, max_tokens=8, seed=1),  # plain sampling; some rows end at EOS, then pad
    Sampling(n=3, temperature=0.7, top_p=0.9, top_k=5, max_tokens=6, min_tokens=3, seed=5),  # every warper, a floor
    Sampling.greedy(6),
]


@pytest.fixture(scope="module")
def engine(random_model_dir):
    return HFEngine(str(random_model_dir))


@pytest.mark.parametrize("sampling", SETTINGS, ids=["sample", "warpers", "greedy"])
def test_decode_equals_generate(engine, sampling):
    texts = ["12+7=", "3+45=", "1+1="]  # different lengths: left padding and its positions are exercised
    rows = [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    input_ids = torch.tensor([[engine.pad_id] * (width - len(r)) + r for r in rows])
    attention = (torch.arange(width) >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    results = []
    for run in (engine._decode, engine._generate_hf):
        torch.manual_seed(sampling.seed or 0)
        results.append(run(input_ids, attention, sampling))
    (ours, our_logprobs), (theirs, their_logprobs) = results
    steps = ours.shape[1]  # generate may run one step past the last EOS; those columns are padding
    assert torch.equal(ours, theirs[:, :steps]) and (theirs[:, steps:] == engine.pad_id).all()
    assert torch.equal(our_logprobs, their_logprobs[:, :steps])
    if sampling.n == 8:
        assert (ours == engine.eos_id).any(), "the case meant to end rows at EOS ended none"
