"""The real vLLM engine (CPU build) on a tiny model: sampling, log-prob parity with HF, weight updates.

Also pins the vLLM internals relayrl relies on (the in-process worker path, reload_weights, the prefix
cache reset), so a vLLM upgrade that moves them fails here first.
"""

import subprocess
import sys

import pytest
import torch

from relayrl.placement.sections import learner_settings
from relayrl.types import Prompt, Sampling

pytestmark = pytest.mark.vllm
VLLM_TEACHER_TOLERANCE = 1e-5  # teacher.engine=vllm vs local, fp32 on CPU: measured 2.4e-7 (2026-12-06)


@pytest.fixture(scope="module")
def engine(random_model_dir):
    from relayrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(str(random_model_dir), max_model_len=64, seed=0)


@pytest.fixture(scope="module")
def hf_model(random_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(random_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    texts = ["12+7=", "3+45=", "99+1="]
    return [
        Prompt(id=str(i), text=t, token_ids=tok(t, add_special_tokens=False)["input_ids"]) for i, t in enumerate(texts)
    ]


def hf_logprobs(model, prompt_ids, response_ids, temperature=1.0):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None]).squeeze(-1)


def test_generate_returns_n_rollouts_per_prompt_with_logprobs(engine, prompts):
    assert engine.model_runner == "v1"  # rollout.model_runner=auto on CPU: vLLM's V2 runner needs Triton
    rollouts = engine.generate(prompts, Sampling(n=3, temperature=1.0, max_tokens=5, seed=1), version=7)
    assert [r.prompt.id for r in rollouts] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert [r.group_index for r in rollouts[:3]] == [0, 1, 2]
    for r in rollouts:
        assert 1 <= len(r.response_ids) <= 5
        assert len(r.behaviour_logprobs) == len(r.response_ids) == len(r.versions)
        assert set(r.versions) == {7}
        assert r.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in r.behaviour_logprobs)


def test_prefix_caching_auto_is_off_when_no_sequence_fills_a_block(engine):
    from relayrl.rollout.vllm_engine import DEFAULT_BLOCK_SIZE, uses_prefix_caching

    cache = engine.llm.llm_engine.vllm_config.cache_config
    assert cache.block_size == DEFAULT_BLOCK_SIZE["cpu"]  # the rule's assumption about this vLLM
    assert cache.enable_prefix_caching is False  # max_model_len 64 < 128
    assert uses_prefix_caching("auto", 129, on_gpu=False) and not uses_prefix_caching("auto", 128, on_gpu=False)
    assert uses_prefix_caching("auto", 64, on_gpu=True) and uses_prefix_caching("on", 8, on_gpu=False)
    assert not uses_prefix_caching("off", 4096, on_gpu=True)


def test_min_tokens_holds_off_the_end_of_sequence(engine, prompts):
    rollouts = engine.generate(prompts, Sampling(n=4, temperature=1.0, max_tokens=12, min_tokens=12, seed=3), 0)
    assert [len(r.response_ids) for r in rollouts] == [12] * len(rollouts)


def test_texts_decoded_once_per_batch_equal_vllms_own_detokenizing(engine, prompts):
    from vllm import SamplingParams

    ours = engine.generate(prompts, Sampling(n=2, temperature=1.0, max_tokens=8, seed=5), 0)
    theirs = engine.llm.generate(
        [{"prompt_token_ids": p.token_ids} for p in prompts],
        [
            SamplingParams(n=2, temperature=1.0, max_tokens=8, logprobs=0, seed=s)
            for s in (5_000_015, 5_000_017, 5_000_019)
        ],
        use_tqdm=False,
    )
    assert [r.response_ids for r in ours] == [list(c.token_ids) for o in theirs for c in o.outputs]
    assert [r.response_text for r in ours] == [c.text for o in theirs for c in o.outputs]


def test_seeded_sampling_is_reproducible(engine, prompts):
    sampling = Sampling(n=4, temperature=1.0, max_tokens=5, seed=123)
    first = [r.response_ids for r in engine.generate(prompts, sampling, 0)]
    again = [r.response_ids for r in engine.generate(prompts, sampling, 0)]
    assert first == again


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_an_hf_forward(engine, hf_model, prompts, temperature):
    """processed_logprobs = log_softmax(logits / T) of the sampled token, as the learner computes it."""
    rollouts = engine.generate(prompts, Sampling(n=4, temperature=temperature, max_tokens=6, seed=3), 0)
    worst = 0.0
    for r in rollouts:
        expected = hf_logprobs(hf_model, r.prompt.token_ids, r.response_ids, temperature)
        worst = max(worst, (expected - torch.tensor(r.behaviour_logprobs)).abs().max().item())
    assert worst < 1e-3


def test_a_vllm_teacher_scores_a_batch_as_the_local_engine_does(engine, random_model_dir, prompts):
    """teacher.engine=vllm (relayrl/learner/teacher_vllm.py): every row's prompt log-probs in one vLLM call, in the
    local engine's columns; before any push, the engine holds the teacher (model.path) the local engine loads."""
    from relayrl.config import load_config
    from relayrl.learner.batching import make_experience
    from relayrl.learner.role import LearnerRole
    from relayrl.learner.teacher_vllm import VLLMTeacher
    from relayrl.types import Score

    rollouts = engine.generate(prompts, Sampling(n=4, temperature=1.0, max_tokens=8, seed=5), version=0)
    exp = make_experience(rollouts, [Score(0.0)] * len(rollouts), pad_id=0)
    config = load_config(None, [f"model.path={random_model_dir}", f"teacher.path={random_model_dir}"])
    local = LearnerRole(learner_settings(config)).score_teacher(exp.select(torch.arange(len(exp)))).teacher_logprobs
    served = VLLMTeacher(engine).score(exp).teacher_logprobs
    assert local is not None and served is not None
    response = local != 0
    assert torch.equal(response, served != 0) and response.sum() == sum(len(r.response_ids) for r in rollouts)
    gap = (local - served).abs().max().item()
    print(f"vllm teacher vs local: max |log-prob gap| {gap:.2e} over {int(response.sum())} tokens")
    assert gap < VLLM_TEACHER_TOLERANCE


def test_weight_update_changes_logprobs_and_matches_the_new_weights(engine, hf_model, prompts, monkeypatch):
    """After load_weights the engine serves the new weights (tied LM head included) with no stale KV."""
    ids = prompts[0].token_ids + [5, 6, 7]
    before = torch.tensor(engine.prompt_logprobs(ids))  # also fills the prefix cache for this prompt
    torch.testing.assert_close(before, hf_logprobs(hf_model, ids[:1], ids[1:]), atol=1e-3, rtol=0)

    resets = []
    original_reset = engine.llm.reset_prefix_cache
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda: resets.append(1) or original_reset())
    new_model = type(hf_model)(hf_model.config)
    new_model.load_state_dict(hf_model.state_dict())
    with torch.no_grad():
        for name, param in new_model.named_parameters():
            param.mul_(1.5 if "embed" in name else 0.8)  # the embedding is also the (tied) LM head
    engine.load_weights(((n, p.detach()) for n, p in new_model.named_parameters()), version=1)
    assert resets == [1] and engine.version == 1

    after = torch.tensor(engine.prompt_logprobs(ids))
    assert (after - before).abs().max() > 0.05
    torch.testing.assert_close(after, hf_logprobs(new_model.eval(), ids[:1], ids[1:]), atol=1e-3, rtol=0)
    rollouts = engine.generate(prompts[:1], Sampling(n=2, temperature=1.0, max_tokens=4, seed=5), 1)
    for r in rollouts:
        expected = hf_logprobs(new_model, r.prompt.token_ids, r.response_ids)
        torch.testing.assert_close(torch.tensor(r.behaviour_logprobs), expected, atol=1e-3, rtol=0)

    engine.load_weights(((n, p.detach()) for n, p in hf_model.named_parameters()), version=2)
    torch.testing.assert_close(torch.tensor(engine.prompt_logprobs(ids)), before, atol=1e-4, rtol=0)


def test_every_push_runs_vllms_weight_update_session_and_one_that_fails_part_way_is_an_error_that_stays(
    random_model_dir,
):
    """relayrl's engine in vLLM's weight-transfer registry serves every push (relayrl/rollout/vllm_transfer.py): the
    worker's own session checks run (no update outside a session); a push whose tensor breaks part-way raises with
    the session closed, and since vLLM cannot roll back a half-reloaded layer the engine refuses to serve, naming
    the push, instead of sampling from mixed weights. In a process of its own: the failed reload leaves vLLM's
    process-wide reload state behind (an engine started after it in the same process loads meta tensors)."""
    script = PUSH_FAILS.replace("MODEL", repr(str(random_model_dir)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


PUSH_FAILS = """
import pytest, torch
from transformers import AutoModelForCausalLM
from relayrl.errors import SyncError
from relayrl.rollout.vllm_engine import VLLMEngine
from relayrl.rollout.vllm_transfer import RelayrlTransferEngine
from relayrl.types import Prompt, Sampling

engine = VLLMEngine(MODEL, max_model_len=64, seed=0)
worker = engine._worker()
assert isinstance(worker.weight_transfer_engine, RelayrlTransferEngine)
with pytest.raises(RuntimeError, match="start_weight_update must be called before update_weights"):
    engine.llm.collective_rpc("update_weights", args=({"named_tensors": []},))
named = [(n, p.detach()) for n, p in AutoModelForCausalLM.from_pretrained(MODEL).named_parameters()]
engine.load_weights(iter(named), version=1)  # a whole session: start, update, finish
broken = named[:3] + [(named[3][0], torch.zeros(3))] + named[4:]  # a tensor of the wrong shape, part-way
with pytest.raises(SyncError, match=r"a weight push failed part-way .*must be restarted"):
    engine.load_weights(iter(broken), version=2)
assert not worker._weight_update_active and engine.version == 1
prompt = Prompt(id="0", text="1+1=", token_ids=[1, 5, 6])
for refused in (lambda: engine.generate([prompt], Sampling(max_tokens=2), 2), lambda: engine.load_weights(iter(named), 3)):
    with pytest.raises(SyncError, match=r"this vLLM engine cannot serve: a weight push failed part-way"):
        refused()
print("ok")
"""


def test_requests_of_one_batch_get_independent_random_streams(engine, hf_model, prompts):
    """A shared seed must not make every prompt of a batch draw the same sample (correlated exploration)."""
    copies = [prompts[0]] * 400
    rollouts = engine.generate(copies, Sampling(n=1, temperature=1.0, max_tokens=1, seed=11), 0)
    first = torch.tensor([r.response_ids[0] for r in rollouts])
    with torch.no_grad():
        probs = torch.softmax(hf_model(torch.tensor([prompts[0].token_ids])).logits[0, -1], -1)
    frequencies = torch.bincount(first, minlength=probs.numel()).float() / len(first)
    assert len(set(first.tolist())) >= 5
    # empirical first-token frequencies follow the model's distribution (400 draws: ~0.025 standard error)
    assert (frequencies - probs).abs().max() < 0.08


def test_learner_keeps_the_sampling_mask_so_the_on_policy_ratio_is_one(engine, random_model_dir, prompts):
    """With top_p=0.9, T=0.7 the learner's log-probs over the same truncated distribution equal vLLM's."""
    from relayrl.config import load_config
    from relayrl.learner.batching import make_experience
    from relayrl.learner.policy import PolicyLearner
    from relayrl.types import Score

    rollouts = engine.generate(prompts, Sampling(n=4, temperature=0.7, top_p=0.9, max_tokens=6, seed=2), 0)
    exp = make_experience(rollouts, [Score(1.0)] * len(rollouts), pad_id=0)
    on = exp.loss_mask.bool()

    def learner(top_p):
        return PolicyLearner(
            learner_settings(
                load_config(
                    None,
                    [
                        f"model.path={random_model_dir}",
                        "rollout.temperature=0.7",
                        f"rollout.top_p={top_p}",
                        "rollout.n=4",
                        "rollout.prompts_per_step=3",
                    ],
                )
            )
        )

    ratio = torch.exp(learner(0.9).logprobs(exp) - exp.behaviour_logprobs)[on]
    assert (ratio - 1).abs().max() < 1e-3
    unmasked = torch.exp(learner(1.0).logprobs(exp) - exp.behaviour_logprobs)[on]
    assert (unmasked - 1).abs().max() > 0.05  # without the mask the ratio is visibly off 1


def test_partial_rollouts_stop_at_the_target_and_continue_under_new_weights(engine, hf_model, prompts):
    """APRIL-style: stop once enough groups finish, keep the rest, continue them after a weight update; every
    token carries the version that produced it and the behaviour log-prob of those weights."""
    from relayrl.types import PartialSample

    engine.load_weights(((n, p.detach()) for n, p in hf_model.named_parameters()), version=3)
    sampling = Sampling(n=1, temperature=1.0, max_tokens=12, seed=0)
    samples = [
        PartialSample(prompt=p, group=g, group_index=0, seed=1000 * g)  # groups of one: the first
        for g, p in enumerate(prompts * 8)
    ]  # response to stop completes the target
    engine.generate_until(samples, sampling, groups_needed=1)
    groups = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    assert sum(all(s.finished for s in g) for g in groups.values()) >= 1
    unfinished = [s for s in samples if not s.finished]
    assert unfinished and all(len(s.token_ids) < 12 for s in unfinished)  # stopped early, tokens kept
    progress = {id(s): len(s.token_ids) for s in unfinished}

    new_model = type(hf_model)(hf_model.config)
    new_model.load_state_dict(hf_model.state_dict())
    with torch.no_grad():
        for param in new_model.parameters():
            param.mul_(0.9)
    engine.load_weights(((n, p.detach()) for n, p in new_model.named_parameters()), version=4)
    engine.generate_until(samples, sampling, groups_needed=len(groups))
    assert all(s.finished for s in samples)
    spanning = 0
    for s in unfinished:
        old = progress[id(s)]
        assert s.versions == [3] * old + [4] * (len(s.token_ids) - old)
        assert len(s.logprobs) == len(s.token_ids) <= 12
        rollout = s.to_rollout()
        for model, lo, hi in ((hf_model, 0, old), (new_model.eval(), old, len(s.token_ids))):
            if hi > lo:  # each piece's behaviour log-probs are those of the weights that sampled it
                expected = hf_logprobs(model, s.prompt.token_ids, rollout.response_ids)[lo:hi]
                torch.testing.assert_close(torch.tensor(rollout.behaviour_logprobs[lo:hi]), expected, atol=1e-3, rtol=0)
        spanning += 0 < old < len(s.token_ids)
    assert spanning, "at least one response should span both versions"
    engine.load_weights(((n, p.detach()) for n, p in hf_model.named_parameters()), version=0)


def test_relayrl_eval_takes_min_tokens_and_a_prompt_limit(random_model_dir, toy_task, capsys):
    import json

    from relayrl.cli import main

    keys = ["reward.fn=exact_match", "rollout.engine=vllm", "rollout.max_tokens=5", "rollout.min_tokens=5"]
    assert main(["eval", str(random_model_dir), str(toy_task["eval"]), *keys, "eval.max_prompts=7"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["n"] == 7 and result["reward_mean"] == 0.0  # five forced tokens never equal a short sum
