"""The agents' endpoint's cost: 32 agents calling it at once against the same engine's generate called directly.

Each agent (relayrl/agents/, one trajectory each) makes `--calls` calls through the real openai client, each
appending the reply and a user turn, in one of four ways: chat completions, `/v1/responses`, and each of them with
`stream=true`. The multi-turn driver batches the calls into the engine as a run does. The baseline, measured in the
same run on the same engine, is what a batch loop without an endpoint does: for each call number, one direct call
of the engine's generate on the 32 prompts the agents' calls rendered (the very prompt ids, recorded). Reported
per way: calls per second, the median wall time of the 32 trajectories and its ratio to the baseline's, and the
added latency of one call (the agent's own time around the call, less the direct generate of its call number).

The engine is relayrl's HF engine (`rollout.engine=hf`) on a tiny random model built here (seconds), or
`--engine scripted`: a fixed reply, no model, so everything measured is the endpoint's own cost.

  .venv/bin/python benchmarks/agent_endpoint.py [--engine hf|scripted] [--agents 32] [--calls 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

WAYS = ("chat", "responses", "chat_stream", "responses_stream")
FILE = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------- the agents
async def chat(client, row, calls: int, latencies: list[tuple[int, float]], stream: bool = False):
    messages = [{"role": "user", "content": row["prompt"]}]
    for number in range(calls):
        start = time.perf_counter()
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            text = (await client.chat.completions.create(model="m", messages=messages)).choices[0].message.content
        latencies.append((number, time.perf_counter() - start))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "+1="}]
    return 0.0


async def responses(client, row, calls: int, latencies: list[tuple[int, float]], stream: bool = False):
    items: list = [{"role": "user", "content": row["prompt"]}]
    for number in range(calls):
        start = time.perf_counter()
        if stream:
            events = await client.responses.create(model="m", input=items, stream=True)
            (response,) = [e.response async for e in events if e.type in ("response.completed", "response.incomplete")]
        else:
            response = await client.responses.create(model="m", input=items)
        latencies.append((number, time.perf_counter() - start))
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items.append({"role": "user", "content": "+1="})
    return 0.0


async def chat_stream(client, row, calls: int, latencies: list[tuple[int, float]]):
    return await chat(client, row, calls, latencies, stream=True)


async def responses_stream(client, row, calls: int, latencies: list[tuple[int, float]]):
    return await responses(client, row, calls, latencies, stream=True)


# ---------------------------------------------------------------------------------------------- the engines
class Recording:
    """The driver's turn source, passed through: records each call's prompt ids by call number."""

    def __init__(self, turns):
        self.turns, self.one_call_per_step = turns, turns.one_call_per_step
        self.prompts: dict[int, list[list[int]]] = {}
        self._calls: dict = {}

    @property
    def pending(self) -> int:
        return self.turns.pending

    def submit(self, key, prompt_ids, sampling, shown=None):
        number = self._calls[key] = self._calls.get(key, -1) + 1
        self.prompts.setdefault(number, []).append(list(prompt_ids))
        self.turns.submit(key, prompt_ids, sampling, shown)

    def step(self):
        return self.turns.step()

    def abort(self):
        self.turns.abort()


class Scripted:
    """A fixed reply ("4" then EOS) to every turn, at once: no model, the endpoint's cost alone."""

    one_call_per_step = True

    def __init__(self, tokenizer):
        self.reply, self.queued = tokenizer("4", add_special_tokens=False)["input_ids"], []
        self.reply.append(tokenizer.eos_token_id)

    @property
    def pending(self) -> int:
        return len(self.queued)

    def submit(self, key, prompt_ids, sampling, shown=None):
        self.queued.append(key)

    def step(self):
        from relayrl.sources.turn_requests import TurnOutput

        queued, self.queued = self.queued, []
        return [
            (k, TurnOutput(list(self.reply), [-0.5] * len(self.reply), [0] * len(self.reply), "stop")) for k in queued
        ]

    def abort(self):
        self.queued = []


def build_turns(engine: str, model_dir: Path, tokenizer):
    if engine == "scripted":
        return lambda: Scripted(tokenizer)
    from relayrl.rollout import build_engine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.turn_requests import turn_requests

    group = LocalEngineGroup(build_engine("hf", str(model_dir), 256, 0))
    return lambda: turn_requests(group)


# ---------------------------------------------------------------------------------------------- measuring
def through_the_endpoint(server, way: str, new_turns, codec, args) -> tuple[float, list[tuple[int, float]], Recording]:
    from relayrl.agents.pool import AgentPool
    from relayrl.config.env import EnvConfig
    from relayrl.sources.trajectories import MultiTurnDriver
    from relayrl.types import Prompt, Sampling

    latencies: list[tuple[int, float]] = []  # (call number, the agent's seconds around the call)
    spec = f"{FILE}:{way}"
    pool = AgentPool(server, spec, {"calls": args.calls, "latencies": latencies}, args.agents, 60.0, codec.tokenizer)
    rows = [Prompt(str(i), f"{i % 10}+{i % 7}=", []) for i in range(args.agents)]
    turns = Recording(new_turns())
    settings = EnvConfig(agent=spec, max_turns=args.calls, max_total_tokens=10_000)
    driver = MultiTurnDriver(turns, pool, codec, settings, Sampling(max_tokens=args.max_tokens, seed=1))
    try:
        start = time.perf_counter()
        driver.run(rows, 1)
        wall = time.perf_counter() - start
    finally:
        pool.close()
    assert len(latencies) == args.agents * args.calls, (way, len(latencies))
    return wall, latencies, turns


def directly(new_turns, recorded: Recording, args) -> list[float]:
    """The engine's generate called directly, one batch per call number, on the prompts the agents rendered."""
    from relayrl.types import Sampling

    turns, sampling, seconds = new_turns(), Sampling(max_tokens=args.max_tokens, seed=1), []
    for number in sorted(recorded.prompts):
        start = time.perf_counter()
        for key, ids in enumerate(recorded.prompts[number]):
            turns.submit(key, ids, sampling)
        while turns.pending:
            turns.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=("hf", "scripted"), default="hf")
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from relayrl.agents.server import AgentServer
    from relayrl.data.chat import ChatCodec
    from relayrl.models.loading import load_tokenizer
    from relayrl.models.tiny import build_tiny

    model_dir = Path(tempfile.mkdtemp(prefix="relayrl-bench-endpoint-"))
    build_tiny([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "], model_dir, seed=0)
    tokenizer = load_tokenizer(str(model_dir))
    codec, new_turns, server = ChatCodec(tokenizer), build_turns(args.engine, model_dir, tokenizer), AgentServer()
    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    added: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}  # (first call, later calls)
    base: list[float] = []
    try:
        for way in WAYS:  # warm-up: imports, the engine's first batches, the client's connection pool
            through_the_endpoint(server, way, new_turns, codec, args)
        for _ in range(args.repeats):  # the ways and the baseline alternate, so drift on a shared machine hits all
            for way in WAYS:
                wall, latencies, recorded = through_the_endpoint(server, way, new_turns, codec, args)
                per_call = directly(new_turns, recorded, args)
                walls[way].append(wall)
                base.append(sum(per_call))
                added[way].append(added_latency(latencies, per_call))
        clients = client_construction(args.agents)
    finally:
        server.close()
    return report(args, walls, added, base, clients)


def added_latency(latencies: list[tuple[int, float]], direct: list[float]) -> tuple[float, float]:
    """The agents' mean time around a call less the direct generate of its call number: for the first calls
    (which wait while the other agents start) and for the later ones."""
    first = statistics.mean(s for n, s in latencies if n == 0) - direct[0]
    later = [s - direct[n] for n, s in latencies if n > 0]
    return first, statistics.mean(later) if later else float("nan")


def client_construction(agents: int) -> tuple[float, float]:
    """Seconds to build the agents' clients: one `openai.AsyncOpenAI` with its own connections per trajectory (as
    the pool did before relayrl/agents/clients.py), and as the pool does now, over one shared connection pool."""
    import openai

    from relayrl.agents.clients import AgentClients

    start = time.perf_counter()
    for i in range(agents):
        openai.AsyncOpenAI(base_url=f"http://127.0.0.1:1/t/{i}/v1", api_key="relayrl", max_retries=0)
    own = time.perf_counter() - start
    start, shared = time.perf_counter(), AgentClients()
    for i in range(agents):
        shared.async_client(f"http://127.0.0.1:1/t/{i}/v1")
    return own, time.perf_counter() - start


def report(args, walls, added, base, clients: tuple[float, float]) -> dict:
    baseline = statistics.median(base)
    calls = args.agents * args.calls
    print(
        f"engine: {args.engine}{' (tiny random Llama, HF generate)' if args.engine == 'hf' else ''}; "
        f"{args.agents} agents x {args.calls} calls, <= {args.max_tokens} tokens a call, {args.repeats} repeats"
    )
    print("| way | calls/s | wall (median) | wall / direct generate | added a call: first | later calls |")
    print("|---|---|---|---|---|---|")
    print(f"| engine generate, directly (baseline) | {calls / baseline:.0f} | {baseline * 1e3:.0f} ms | 1.00 | - | - |")
    figures: dict = {"baseline_s": baseline, "client_construction_s": {"own": clients[0], "shared": clients[1]}}
    for way in WAYS:
        wall = statistics.median(walls[way])
        first, later = (statistics.median(values) for values in zip(*added[way]))
        ratio = f"{wall / baseline:.2f}" if args.engine == "hf" else "- (no model to compare with)"
        print(
            f"| {way} | {calls / wall:.0f} | {wall * 1e3:.0f} ms | {ratio} | {first * 1e3:.0f} ms | {later * 1e3:.0f} ms |"
        )
        figures[way] = {"wall_s": wall, "ratio": wall / baseline, "added_first_s": first, "added_later_s": later}
    print(
        f"building the {args.agents} agents' openai clients: {clients[1] * 1e3:.0f} ms over one connection pool (the "
        f"pool's way), {clients[0] * 1e3:.0f} ms with a connection pool each"
    )
    return figures


if __name__ == "__main__":
    main()
