"""Per-request sampling seeds: every sample of a batch gets its own random stream."""

from relayrl.rollout.seeds import request_seed


def test_request_seeds_expand_to_distinct_sample_seeds():
    n, prompts = 8, 64
    # vLLM seeds sample j of a request with (request seed + j)
    sample_seeds = [request_seed(3, i, n) + j for i in range(prompts) for j in range(n)]
    assert len(set(sample_seeds)) == n * prompts
    assert request_seed(None, 5, n) is None
    assert request_seed(4, 0, n) != request_seed(3, 0, n)
