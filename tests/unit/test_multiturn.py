"""The multi-turn driver with a scripted engine and in-process environments (fast): what `env.tito` does when
the template rewrites earlier turns, overlong trajectories kept and flagged, per-turn rewards combined, a
failing environment handled per env.on_error, and lockstep vs interleaved giving the same trajectories."""

from __future__ import annotations

import pytest

from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.envs.base import Step, as_messages, as_step
from relayrl.errors import EnvError
from relayrl.sources.trajectories import MultiTurnDriver
from relayrl.sources.trajectory import combine_rewards
from relayrl.sources.turn_requests import TurnOutput
from relayrl.types import Prompt, Sampling
from tests.unit.test_tito import chat_tokenizer


class ScriptedTurns:
    """An engine whose turn i of every trajectory is `script[i]` (EOS appended); records each prompt. Like HF
    generate, it serves what is queued when `step` is called (`calls` counts them)."""

    one_call_per_step = True

    def __init__(self, codec: ChatCodec, script: list[str], eos: bool = True):
        self.codec, self.script, self.eos = codec, script, eos
        self.queued, self.prompts, self.calls = [], [], 0

    @property
    def pending(self):
        return len(self.queued)

    def submit(self, key, prompt_ids, sampling, shown=None):
        self.queued.append((key, list(prompt_ids), sampling))

    def step(self):
        out, queued, self.queued = [], self.queued, []
        self.calls += 1
        for key, ids, sampling in queued:
            turn = sum(1 for k, _ in self.prompts if k == key)
            self.prompts.append((key, ids))
            tokens = self.codec.encode(self.script[min(turn, len(self.script) - 1)])
            tokens += [self.codec.tokenizer.eos_token_id] if self.eos else []
            cut = tokens[: sampling.max_tokens]
            finish = "length" if len(cut) < len(tokens) else "stop"
            out.append((key, TurnOutput(cut, [-0.5] * len(cut), [3] * len(cut), finish)))
        return out

    def abort(self):
        self.queued = []


class InlinePool:
    """EnvPool's interface, environments in this process (no deadlines): results come at the next poll."""

    def __init__(self, cls, slots: int = 64):
        self.cls, self.slots, self.envs, self.ready = cls, slots, {}, []

    @property
    def free(self):
        return self.slots - len(self.envs)

    @property
    def busy(self):
        return bool(self.ready)

    def reset(self, key, row, where):
        self.envs[key] = self.cls()
        env = self.envs[key]
        self.ready.append((key, "ok", (as_messages(env.reset(row), where), tuple(getattr(env, "stop", ())))))

    def step(self, key, action, where, turn=None):
        try:
            self.ready.append((key, "ok", as_step(self.envs[key].step(action), where)))
        except Exception as err:  # noqa: BLE001 - the fake pool reports any error, as the real one does
            self.ready.append((key, "error", f"raised {err}"))

    def release(self, key):
        self.envs.pop(key, None)

    def poll(self, timeout):
        out, self.ready = self.ready, []
        return out


class Again:
    """Always wrong: 'again' until the driver stops it."""

    def reset(self, row):
        return row["prompt"]

    def step(self, action):
        return Step("again", 0.25, False, {"success": False})


class TricklePool(InlinePool):
    """Environment answers arrive one per poll, as from worker processes that finish one after another."""

    def poll(self, timeout):
        out, self.ready = self.ready[:1], self.ready[1:]
        return out


def run(cls, script, lockstep=False, prompts=("2+3=",), n=2, style="qwen", pool=InlinePool, **env):
    codec = ChatCodec(chat_tokenizer(style))
    turns = ScriptedTurns(codec, script)
    settings = EnvConfig(fn="x", **env)
    driver = MultiTurnDriver(turns, pool(cls), codec, settings, Sampling(max_tokens=32), lockstep=lockstep)
    batch = driver.run([Prompt(id=str(i), text=p, token_ids=[]) for i, p in enumerate(prompts)], n)
    return batch, turns, codec


def test_a_batch_engine_gets_one_call_per_wave_of_turns_not_one_per_trajectory():
    batch, turns, _ = run(Again, ["x=1"], prompts=("1+1=", "2+2=", "3+3="), n=2, max_turns=2, pool=TricklePool)
    assert len(batch.rollouts) == 6 and turns.calls == 2  # every first turn in one call, every second in one


def test_each_turns_prompt_is_the_concatenation_and_observations_are_masked():
    batch, turns, codec = run(Again, ["x=1", "x=2", "x=3"], max_turns=3)
    assert [r.group_index for r in batch.rollouts] == [0, 1]
    for rollout in batch.rollouts:
        full = rollout.prompt.token_ids + rollout.response_ids
        seen = [ids for key, ids in turns.prompts if ids[: len(rollout.prompt.token_ids)] == rollout.prompt.token_ids]
        assert all(full[: len(ids)] == ids for ids in seen)  # every turn's prompt is a prefix of the final sequence
        generated = [t for text in ["x=1", "x=2", "x=3"] for t in codec.encode(text) + [codec.tokenizer.eos_token_id]]
        assert [t for t, m in zip(rollout.response_ids, rollout.loss_mask) if m] == generated
        assert all(lp == -0.5 for lp, m in zip(rollout.behaviour_logprobs, rollout.loss_mask) if m)
        assert codec.tokenizer.decode(full).count("again") == 2  # two observations, both mask 0
    assert batch.metrics["env/turns_mean"] == 3 and batch.metrics["response/obs_token_frac"] > 0
    assert batch.rewards == [pytest.approx(0.75)] * 2


def test_combined_rewards():
    assert combine_rewards([0.0, 0.0, 1.0], "sum", 0.5) == 1.0
    assert combine_rewards([0.5, 1.0], "final", 0.5) == 1.0
    assert combine_rewards([0.0, 0.0, 1.0], "discounted", 0.5) == 0.25


class Thinking(Again):
    def step(self, action):
        return Step("again", 1.0 if action.endswith("done") else 0.0, action.endswith("done"))


@pytest.mark.parametrize(
    "tito", ["strict", "fork", "retokenize", None], ids=["strict", "fork", "retokenize", "default"]
)
def test_tito_policies_on_a_template_that_drops_earlier_thinking(tito):
    script = ["<think>a</think>1", "<think>b</think>done"]
    if tito == "strict":
        with pytest.raises(EnvError, match="sample 0#0 turn 1: the chat template renders the earlier turns"):
            run(Thinking, script, style="drops", tito=tito, n=1)
        return
    batch, turns, codec = run(Thinking, script, style="drops", n=1, **({} if tito is None else {"tito": tito}))
    assert batch.metrics["tito/prefix_mismatch"] == 1
    second_prompt = codec.tokenizer.decode(turns.prompts[1][1])
    assert "<think>a</think>" not in second_prompt  # the next turn continues from the re-rendered history
    last = batch.rollouts[0]  # the trajectory's sample; a fork (the part before the re-render) comes after it
    trained = codec.tokenizer.decode([t for t, m in zip(last.response_ids, last.loss_mask) if m])
    assert trained == "<think>b</think>done<|im_end|>"  # re-rendered earlier turns are not trained again
    assert last.turn_rewards == [(len(last.response_ids) - 1, 1.0)]  # its one turn's reward (the second's), placed
    if tito in ("fork", None):  # the default forks: the sample before the re-render is kept, the same prompt
        assert batch.metrics["tito/forks"] == 1 and len(batch.rollouts) == 2
        first = batch.rollouts[1]
        assert [r.group_index for r in batch.rollouts] == [0, 1] and batch.rewards == [1.0, 1.0]
        assert first.fork_of == 0 and first.prompt.token_ids == last.prompt.token_ids
        assert first.turn_rewards == [(len(first.response_ids) - 1, 0.0)]  # the first turn's, at its end
        assert codec.tokenizer.decode([t for t, m in zip(first.response_ids, first.loss_mask) if m]).startswith(
            "<think>a</think>1"
        )
    else:
        assert len(batch.rollouts) == 1 and batch.metrics["tito/forks"] == 0


def test_an_overlong_trajectory_is_kept_cut_at_the_limit_and_flagged():
    batch, _, _ = run(Again, ["x=12345"], max_turns=10, max_total_tokens=30)
    assert len(batch.rollouts) == 2 and all(len(r.response_ids) == 30 for r in batch.rollouts)
    assert batch.metrics["env/truncated_frac"] == 1.0 and all(r.finish_reason == "length" for r in batch.rollouts)
    dropped, _, _ = run(Again, ["x=12345"], max_turns=10, max_total_tokens=30, on_overflow="drop")
    assert dropped.rollouts == [] and dropped.metrics["env/truncated_frac"] == 1.0


class Breaks(Again):
    def step(self, action):
        raise ValueError("tool broke")


def test_a_failing_environment_per_on_error():
    with pytest.raises(EnvError, match="sample 0#0 turn 1: raised tool broke .*env.on_error"):
        run(Breaks, ["x"], n=1)
    zero, _, _ = run(Breaks, ["x"], on_error="zero")
    assert zero.rewards == [0.0, 0.0] and zero.metrics["env/errors"] == 2
    skip, _, _ = run(Breaks, ["x"], on_error="skip")
    assert skip.rollouts == []


def test_lockstep_and_interleaved_make_the_same_trajectories():
    a, _, _ = run(Again, ["1", "2"], max_turns=3, prompts=("1+1=", "2+2="))
    b, _, _ = run(Again, ["1", "2"], max_turns=3, prompts=("1+1=", "2+2="), lockstep=True)
    assert [r.response_ids for r in a.rollouts] == [r.response_ids for r in b.rollouts]


def test_env_results_are_checked():
    with pytest.raises(EnvError, match="step must return relayrl.envs.Step"):
        as_step("nope", "here")
    with pytest.raises(EnvError, match="observation of None needs done=True"):
        as_step((None, 0.0, False), "here")
    assert as_step(("hi", 1, True), "here") == Step("hi", 1.0, True, {})


class BreaksOnce(Again):
    made = 0

    def __init__(self):
        BreaksOnce.made += 1
        self.breaks = BreaksOnce.made == 1

    def step(self, action):
        if self.breaks:
            raise ValueError("tool broke")
        return Step(None, 1.0, True)


def test_a_skipped_trajectory_leaves_its_group_starting_at_index_0():
    BreaksOnce.made = 0
    batch, _, _ = run(BreaksOnce, ["x"], on_error="skip", n=3)
    assert [r.group_index for r in batch.rollouts] == [0, 1] and batch.metrics["env/errors"] == 1


def test_a_turn_is_cut_where_it_completes_the_environments_stop_string():
    from relayrl.envs.builtins import CalculatorEnv

    class Calculator(CalculatorEnv):
        def reset(self, row):
            return super().reset({**row, "answer": "5"})

    batch, turns, codec = run(Calculator, ["<calc>2+3</calc>junk", "5"], n=1)
    rollout = batch.rollouts[0]
    trained = codec.tokenizer.decode([t for t, m in zip(rollout.response_ids, rollout.loss_mask) if m])
    assert trained == "<calc>2+3</calc>5<|im_end|>" and batch.rewards == [1.0]
    assert batch.metrics["env/tool_calls"] == 1 and batch.metrics["env/success"] == 1
    assert "<tool_response>\n5\n</tool_response>" in codec.tokenizer.decode(turns.prompts[1][1])


def test_a_trajectory_whose_last_turn_was_cut_at_its_budget_finishes_length():
    """It used to report "stop" (only max_total_tokens counted), so response/truncated_frac missed it."""
    cut, _, _ = run(Again, ["x=12345"], max_turns=1, max_tokens_per_turn=3)
    assert [r.finish_reason for r in cut.rollouts] == ["length", "length"]
    assert cut.metrics["env/truncated_frac"] == 0  # within max_total_tokens: kept whole, not flagged as overflow
    earlier, _, _ = run(Again, ["x=12345", "1"], max_turns=2, max_tokens_per_turn=3)  # only the first turn cut
    assert [r.finish_reason for r in earlier.rollouts] == ["stop", "stop"]


class Accented(Again):
    def step(self, action):
        return Step("encore: réessaie €", 0.0, False)


def test_observation_characters_the_tokenizer_lacks_are_counted_and_warned_about_once():
    from relayrl.errors import DataWarning

    with pytest.warns(DataWarning) as caught:
        batch, _, _ = run(Accented, ["1"], max_turns=3, n=2)
    assert batch.metrics["env/unknown_chars"] == 4  # two observations in each of two trajectories
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and messages[0].startswith(
        "sample 0#0 turn 1: env.fn='x': the observation holds 'é', '€', not in"
    )
    assert "env/unknown_chars" in messages[0]
    clean, _, _ = run(Again, ["1"], max_turns=3)
    assert clean.metrics["env/unknown_chars"] == 0


class KilledPool(InlinePool):
    """A worker that a signal from outside ended, as EnvPool reports it."""

    def step(self, key, action, where, turn=None):
        self.ready.append((key, "killed", "environment worker died (killed by signal 9 (SIGKILL))"))


def test_a_worker_killed_by_a_signal_is_not_blamed_on_the_environment():
    with pytest.raises(EnvError) as info:
        run(Again, ["1"], n=1, pool=KilledPool)
    message = str(info.value)
    assert message.startswith("sample 0#0 turn 1: environment worker died (killed by signal 9 (SIGKILL)): a signal")
    assert "env.on_error" not in message
    zero, _, _ = run(Again, ["1"], on_error="zero", pool=KilledPool)  # still handled per env.on_error
    assert zero.rewards == [0.0, 0.0]


def test_the_metrics_of_two_batches_merge_as_one_weighted_by_trajectories():
    from relayrl.errors import DataWarning
    from relayrl.sources.multi_turn import LARGEST, PER_TRAJECTORY, SUMMED, merge_batch_metrics

    short, _, _ = run(Again, ["1"], max_turns=1, n=1)  # 1 trajectory of 1 turn
    with pytest.warns(DataWarning):
        long, _, _ = run(Accented, ["1"], max_turns=3, n=3)  # 3 of 3 turns, 2 unknown-character observations each
    assert set(short.metrics) == SUMMED | LARGEST | PER_TRAJECTORY
    merged = merge_batch_metrics(short.metrics, {**long.metrics, "reward/errors": 1.0})
    assert merged["env/trajectories"] == 4 and merged["env/turns_mean"] == (1 * 1 + 3 * 3) / 4
    assert merged["env/turns_max"] == 3 and merged["env/unknown_chars"] == 6 and merged["reward/errors"] == 1.0


def response_length(prompts, completions):
    """A reward.fn that scores each sample's own text: a fork scored on its own would differ from its trajectory."""
    return [float(len(c)) for c in completions]


def test_a_forked_sample_takes_its_trajectorys_reward_fn_score_not_one_of_its_own():
    import threading

    from relayrl.config.reward import RewardConfig
    from relayrl.rewards.service import build_reward_service
    from relayrl.sources.multi_turn import MultiTurnSource

    batch, _, _ = run(Thinking, ["<think>a</think>1", "<think>b</think>done"], style="drops", n=1)
    last, fork = batch.rollouts
    assert fork.fork_of == 0 and last.response_text != fork.response_text
    source = MultiTurnSource.__new__(MultiTurnSource)  # only its scoring: no engines, no workers
    source._lock, source._generated, source.with_reward_fn = threading.Lock(), {id(batch.rollouts): batch}, True
    with build_reward_service(RewardConfig(fn="tests.unit.test_multiturn:response_length")) as source.rewards:
        scores, _ = source.score_samples(batch.rollouts)
    assert scores[0] is not None and scores[1] is not None
    assert scores[1].reward == scores[0].reward == 1.0 + len(last.response_text)  # env's 1.0 + the fn's
