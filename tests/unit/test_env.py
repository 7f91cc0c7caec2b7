"""Environments: loading by spec, the built-ins, worker processes with deadlines (a hanging step costs only its
trajectory), and a multi-turn batch through a real engine (HF generate on a tiny fp32 model): every turn's prompt
is the concatenation of the trajectory's segments, every trained token has the engine's log-prob (matching the
learner's forward), every observation token has mask 0. And the workers' start (the driver's script is not re-run
in them) and stop signals (ignored: the driver stops them), and a worker killed from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from relayrl.build import source_settings
from relayrl.config.env import EnvConfig
from relayrl.data.chat import ChatCodec
from relayrl.envs import Step, load_env_class
from relayrl.envs.builtins import CalculatorEnv, RetryEnv, evaluate_arithmetic
from relayrl.envs.pool import EnvPool
from relayrl.errors import EnvError
from relayrl.sources.trajectories import MultiTurnDriver
from relayrl.sources.turn_requests import BatchTurns
from relayrl.types import Prompt, Sampling
from tests.unit.test_multiturn import ScriptedTurns
from tests.unit.test_tito import chat_tokenizer

SLOW_ENV = """
import time
from relayrl.envs import Step

class Hangs:
    def reset(self, row):
        self.prompt = row["prompt"]
        return row["prompt"]

    async def step(self, action):  # async environments are accepted
        if self.prompt == "hang":
            time.sleep(600)
        return Step("again", 1.0, True)
"""


def test_loading_by_spec(tmp_path):
    (tmp_path / "envs.py").write_text(SLOW_ENV)
    assert load_env_class("retry") is RetryEnv
    assert load_env_class(f"{tmp_path / 'envs.py'}:Hangs").__name__ == "Hangs"
    with pytest.raises(EnvError, match="has no class 'Nope'"):
        load_env_class(f"{tmp_path / 'envs.py'}:Nope")
    with pytest.raises(EnvError, match="not a built-in"):
        load_env_class("nope")
    with pytest.raises(EnvError, match="file not found"):
        load_env_class("missing.py:X")


def test_builtins():
    assert evaluate_arithmetic("(2+3)*4 - 1") == 19
    with pytest.raises(ValueError):
        evaluate_arithmetic("__import__('os')")
    calc = CalculatorEnv()
    assert calc.reset({"prompt": "12*13=", "answer": "156"}) == "12*13="
    assert calc.step("<calc>12*13</calc>") == Step({"role": "tool", "content": "156"}, 0.0, False, {"tool_calls": 1})
    assert calc.step("156") == Step(None, 1.0, True, {"success": True})
    retry = RetryEnv()
    retry.reset({"prompt": "2+3=", "answer": 5})
    assert not retry.step("6").done and retry.step(" 5 ").reward == 1.0


def test_code_feedback_returns_the_failing_output():
    from relayrl.envs.builtins import CodeFeedbackEnv

    env = CodeFeedbackEnv(timeout_s=5.0)
    env.reset({"prompt": "print hi", "tests": [{"stdin": "", "stdout": "hi"}]})
    wrong = env.step("```python\nprint('ho')\n```")
    assert not wrong.done and wrong.observation.startswith("0/1 tests pass") and "ho" in wrong.observation
    assert env.step("```python\nprint('hi')\n```") == Step(None, 1.0, True, {"success": True})


def test_a_hanging_step_times_out_while_the_other_trajectories_finish(tmp_path):
    (tmp_path / "envs.py").write_text(SLOW_ENV)
    codec = ChatCodec(chat_tokenizer("qwen"))
    pool = EnvPool(f"{tmp_path / 'envs.py'}:Hangs", {}, slots=3, timeout_s=1.0)
    try:
        settings = EnvConfig(fn="x", on_error="zero", timeout_s=1.0)
        driver = MultiTurnDriver(ScriptedTurns(codec, ["1"]), pool, codec, settings, Sampling(max_tokens=8))
        prompts = [Prompt(id=str(i), text=t, token_ids=[]) for i, t in enumerate(["a", "hang", "b", "c"])]
        batch = driver.run(prompts, n=1)
    finally:
        pool.close()
    assert batch.rewards == [1.0, 0.0, 1.0, 1.0]  # the hung one is scored 0 (on_error=zero), the rest finish
    assert batch.metrics["env/timeouts"] == 1 and batch.metrics["env/errors"] == 0


def next_results(pool):
    """The next non-empty poll (a worker saying it is ready ends a poll with nothing)."""
    while not (results := pool.poll(30)):
        pass
    return results


def test_a_trajectory_released_mid_step_does_not_answer_the_next(tmp_path):
    (tmp_path / "envs.py").write_text(SLOW_ENV)
    pool = EnvPool(f"{tmp_path / 'envs.py'}:Hangs", {}, slots=1, timeout_s=30.0)
    try:
        pool.reset("a", {"prompt": "hang"}, "a")
        assert [k for k, _, _ in next_results(pool)] == ["a"]
        pool.step("a", "x", "a")  # hangs
        pool.release("a")  # given up (an error elsewhere ended the batch): its worker is replaced
        pool.reset("b", {"prompt": "b"}, "b")
        assert next_results(pool) == [("b", "ok", ([{"role": "user", "content": "b"}], ()))] and pool.free == 0
    finally:
        pool.close()


class RecordingTurns(BatchTurns):
    def __init__(self, engine):
        super().__init__(engine)
        self.prompts, self.outputs = [], []

    def submit(self, key, prompt_ids, sampling, shown=None):
        self.prompts.append((key, list(prompt_ids)))
        super().submit(key, prompt_ids, sampling)

    def step(self):
        finished = super().step()
        self.outputs += finished
        return finished


def test_through_a_real_engine_prompts_are_the_segments_and_only_generated_tokens_train(random_model_dir):
    from relayrl.learner.batching import make_experience
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.types import Score
    from tests.reference import token_logprobs

    engine = HFEngine(str(random_model_dir))
    codec = ChatCodec(engine.tokenizer)
    turns = RecordingTurns(engine)
    pool = EnvPool("retry", {"feedback": " 1+1="}, slots=4, timeout_s=30)
    try:
        settings = EnvConfig(fn="retry", max_turns=3, max_total_tokens=40)
        sampling = Sampling(max_tokens=6, temperature=1.0, seed=0)
        rows = [Prompt(id=str(i), text=f"{i}+{i}=", token_ids=[], columns={"answer": "x"}) for i in range(3)]
        batch = MultiTurnDriver(turns, pool, codec, settings, sampling).run(rows, n=2)
    finally:
        pool.close()
    assert len(batch.rollouts) == 6 and batch.metrics["env/turns_mean"] > 1
    by_key = {}
    for key, ids in turns.prompts:
        by_key.setdefault(key, []).append(ids)
    generated = {}
    for key, output in turns.outputs:
        generated.setdefault(key, []).append(output)
    for key, rollout in enumerate(batch.rollouts):  # keys are handed out in batch order
        full = rollout.prompt.token_ids + rollout.response_ids
        first = len(rollout.prompt.token_ids)
        for _turn, (ids, output) in enumerate(zip(by_key[key], generated[key])):
            assert ids == full[: len(ids)]  # the turn's prompt: the concatenation of everything before it
            assert full[len(ids) : len(ids) + len(output.token_ids)] == output.token_ids
            mask = rollout.loss_mask[len(ids) - first : len(ids) - first + len(output.token_ids)]
            logprobs = rollout.behaviour_logprobs[len(ids) - first : len(ids) - first + len(output.token_ids)]
            assert all(mask) and logprobs == output.logprobs
        assert sum(rollout.loss_mask) == sum(len(o.token_ids) for o in generated[key])  # the rest are observations
    exp = make_experience(batch.rollouts, [Score(r) for r in batch.rewards], engine.pad_id)
    with torch.no_grad():
        logits = engine.model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits[:, :-1]
    learner = token_logprobs(logits.float(), exp.input_ids[:, 1:])
    mask = exp.loss_mask.bool()
    assert batch.metrics["response/obs_token_frac"] > 0
    assert (learner[mask] - exp.behaviour_logprobs[mask]).abs().max() < 1e-3  # engine vs learner, across turns


def test_the_multi_turn_source_scores_with_the_environment_and_a_reward_fn(random_model_dir, tmp_path):
    from types import SimpleNamespace

    from relayrl.config import Config
    from relayrl.rewards.service import build_reward_service
    from relayrl.rollout.hf_engine import HFEngine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.multi_turn import MultiTurnSource

    config = Config(
        model={"path": str(random_model_dir)},
        env={"fn": "retry", "max_turns": 2, "max_total_tokens": 24, "max_inflight": 2},
        reward={"fn": "exact_match"},
        rollout={"n": 2, "prompts_per_step": 2, "max_tokens": 4},
    )
    rewards = build_reward_service(config.reward)
    source = MultiTurnSource(
        source_settings(config),
        LocalEngineGroup(HFEngine(str(random_model_dir))),
        rewards,
        None,
        SimpleNamespace(version=0),
    )
    try:
        rows = [Prompt(id=str(i), text=f"{i}+{i}=", token_ids=[], columns={"answer": str(2 * i)}) for i in range(2)]
        batch = source.score(source.generate(rows, source.sampling(0)))
        greedy = source.evaluate(rows)
    finally:
        source.close()
        rewards.close()
    assert len(batch.rollouts) == 4 and all(set(s.components) == {"env", "fn"} for s in batch.scores)
    assert all(s.reward == s.components["env"] + s.components["fn"] for s in batch.scores)
    assert 1 <= batch.metrics["env/turns_mean"] <= 2 and "tito/prefix_mismatch" in batch.metrics
    assert set(greedy) == {"eval/greedy", "eval/success", "eval/first_turn_success", "eval/turns_mean"}


@pytest.mark.parametrize(
    "settings",
    [
        [
            "env.fn=retry",
            "rollout.engine=hf",
            "env.max_turns=2",
            "rollout.max_tokens=3",
            'env.kwargs={"feedback": "1+1="}',
        ],
        [
            "--env",
            "retry",
            "--engine",
            "hf",
            "--max-turns",
            "2",
            "--max-tokens",
            "3",
            "--env-kwargs",
            '{"feedback": "1+1="}',
        ],
    ],
    ids=["keys", "deprecated flags"],
)
def test_relayrl_eval_with_an_environment(random_model_dir, tmp_path, capsys, settings):
    import json

    from relayrl.cli import main

    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    assert main(["eval", str(random_model_dir), str(data), *settings]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 3 and 1 <= result["turns_mean"] <= 2 and result["reward_mean"] == result["success"]
    assert set(result) == {
        "reward_mean",
        "success",
        "first_turn_success",
        "turns_mean",
        "n",
        "errors",
        "timeouts",
        "truncated",
    }
    assert err.count("deprecated") == (settings[0] == "--env")  # one line for every old flag
    if settings[0] == "--env":
        assert "env.fn=retry" in err and "env.max_turns=2" in err and "env.kwargs=" in err


def test_a_pool_whose_workers_cannot_load_fails_naming_env_fn_and_releasing_after_is_harmless(tmp_path):
    (tmp_path / "broken.py").write_text("raise ImportError('no tools here')\n")
    pool = EnvPool(f"{tmp_path / 'broken.py'}:Env", {}, slots=1, timeout_s=5.0)
    pool.reset("a", {"prompt": "1+1="}, "a")
    with pytest.raises(EnvError, match="could not load env.fn: .*no tools here"):
        while True:
            pool.poll(5.0)
    pool.release("a")  # the driver's clean-up after the error: the pool is closed, nothing left to replace
    assert pool.workers == []


def ready_pool(slots: int) -> EnvPool:
    pool = EnvPool("retry", {}, slots=slots, timeout_s=30.0)
    deadline = time.monotonic() + 60
    while not all(w.ready for w in pool.workers):
        assert time.monotonic() < deadline, "the workers did not start"
        assert pool.poll(0.5) == []
    return pool


def test_workers_and_their_server_ignore_the_stop_signals_a_group_gets():
    """SIGTERM/SIGINT to the whole process group (`timeout`, a scheduler, Ctrl-C) reach every worker: they carry
    on, and the driver stops them after its step (relayrl/run/preemption.py)."""
    from relayrl.rewards import supervised

    pool = ready_pool(2)
    try:
        for pid in [w.process.pid for w in pool.workers] + [supervised._SERVER._forkserver_pid]:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert all(w.process.is_alive() for w in pool.workers)
        pool.reset("a", {"prompt": "1+1=", "answer": "2"}, "a")
        assert next_results(pool) == [("a", "ok", ([{"role": "user", "content": "1+1="}], ()))]
        pool.step("a", "2", "a")
        [(key, status, step)] = next_results(pool)
        assert (key, status, step.reward, step.done) == ("a", "ok", 1.0, True)
    finally:
        pool.close()


def test_a_step_sent_to_a_worker_killed_by_a_signal_is_reported_killed_not_raised():
    pool = ready_pool(1)
    try:
        pool.reset("a", {"prompt": "1+1=", "answer": "2"}, "a")
        next_results(pool)
        process = pool.workers[0].process
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        time.sleep(0.2)  # its end of the pipe is closed: a write gets EPIPE
        pool.step("a", "2", "a")  # used to raise BrokenPipeError
        assert next_results(pool) == [("a", "killed", "environment worker died (killed by signal 9 (SIGKILL))")]
        assert pool.free == 1 and pool.workers[0].process.is_alive()  # replaced
    finally:
        pool.close()


DRIVER = """
import sys
print("driver module run", flush=True)  # once: workers do not re-run the driver's script
import torch  # a heavy top-level import, as a training script has

from relayrl.envs.pool import EnvPool

if __name__ == "__main__":
    pool = EnvPool("retry", {}, slots=3, timeout_s=30.0)
    while not all(w.ready for w in pool.workers):
        pool.poll(0.5)
    pool.close()
    print("started 3", flush=True)
"""


def test_workers_do_not_re_run_the_drivers_main_module(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py")], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["driver module run", "started 3"]  # spawn printed it 4 times
