"""Sampling for the SDK's `SamplingClient`: one relayrl rollout engine per base model, vLLM or HF generate as the
service's `rollout` section says (relayrl/service/settings.py), whose weights are swapped for the sampler a request names, through the engine's own push
(`load_weights(named_tensors, version)`, the one relayrl's learners use), and only when they differ from what the
engine holds.

A sampler's weights are a `save_weights_for_sampler` copy (the trained model merged, relayrl/service/training.py)
or the base's own. `checked` maps the SDK's `SamplingParams` onto relayrl's `Sampling`, and `sample` samples with the
engine's own loop (one seeded stream per sample, so a sample does not depend on the requests beside it); a stop token id
cuts a sequence after the first one it samples, a stop string after the token that completes it in the decoded
text (transformers' stop-string criteria cannot take strings outside a tokenizer's vocabulary, such as
role_colon's "\n\nUser:" on a character tokenizer). EOS always stops, as in the engine.
The sequences' log-probs are the engine's (after temperature), so at temperature 1 they are the model's own.
Sample requests waiting on the worker together share engine calls (`SampleQueue`, one call per sampling but for
the seeds): the cookbook sends a step's prompts as one request each, and one call per request made the
cookbook-style step's sampling 0.15 s of work instead of 0.06-0.08 s (the step 3.7-3.8x `relayrl train`'s -> 2.7x,
benchmarks/service_overhead.py).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from relayrl.service.errors import UserError
from relayrl.service.settings import ServiceSettings
from relayrl.service.wire import Sequence
from relayrl.types import Prompt, Sampling

if TYPE_CHECKING:
    from relayrl.rollout.protocols import Engine

SHARED_CALL = 64  # sample requests one engine call serves at most


@dataclass
class Sampler:
    """What a sampling session serves: a base model and the weights to put in its engine (None: the base's)."""

    base_name: str
    weights_key: str | None  # the sampler path whose weights it serves; None: the base model


@dataclass
class Served:
    """A base model's engine with what sampling checks requests against (read from the base's directory, so
    either engine serves them alike): its tokenizer (stop strings), vocabulary and context length."""

    engine: Engine  # HFEngine or VLLMEngine
    tokenizer: object
    vocab: int
    context: int | None


class Engines:
    """One engine per base model, built as a run builds its engine (`engine_from_settings`, from the service's
    `rollout` section) on the first request that samples from that base."""

    def __init__(self, bases: dict[str, str], settings: ServiceSettings):
        self.bases = bases  # name -> local directory
        self.settings = settings
        self.served: dict[str, Served] = {}
        self.loaded: dict[str, str | None] = {}  # base name -> the weights key its engine holds
        self.base_weights: dict[str, dict[str, torch.Tensor]] = {}  # read when a base's own weights go back in
        self.versions = 0

    def start(self, base_name: str) -> Served:
        if base_name not in self.served:
            from transformers import AutoConfig

            from relayrl.models.loading import context_length, load_tokenizer
            from relayrl.rollout.build import engine_from_settings

            path = self.bases[base_name]
            context = context_length(path)
            engine = engine_from_settings(self.settings.engine_settings(path), context or 4096)
            vocab = AutoConfig.from_pretrained(path).get_text_config().vocab_size
            self.served[base_name] = Served(
                engine, load_tokenizer(path, key=f"base_model={base_name!r}"), vocab, context
            )
            self.loaded[base_name] = None
        return self.served[base_name]

    def serving(self, sampler: Sampler, snapshots: dict[str, dict[str, torch.Tensor]]) -> Served:
        """The base's engine, holding `sampler`'s weights (pushed only when they differ from what it holds)."""
        served = self.start(sampler.base_name)
        if self.loaded[sampler.base_name] != sampler.weights_key:
            if sampler.weights_key is None:
                weights = self.base_weights_of(sampler.base_name)
            else:
                weights = snapshots[sampler.weights_key]
            self.versions += 1
            served.engine.load_weights(weights.items(), self.versions)
            self.loaded[sampler.base_name] = sampler.weights_key
        return served

    def base_weights_of(self, base_name: str) -> dict[str, torch.Tensor]:
        if base_name not in self.base_weights:
            from relayrl.models.loading import load_causal_lm

            model = load_causal_lm(self.bases[base_name], key=f"base_model={base_name!r}")
            self.base_weights[base_name] = {name: p.detach() for name, p in model.named_parameters()}
        return self.base_weights[base_name]


@dataclass(eq=False)
class Queued:
    """A sample request waiting on the service's worker, then what it answers: (sequences, prompt log-probs) or the
    error its call raised."""

    sampler_id: str
    sampler: Sampler
    request: object
    outcome: tuple[list[Sequence], list[float] | None] | Exception | None = None

    def answer(self) -> tuple[list[Sequence], list[float] | None]:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        assert self.outcome is not None, "answered before its call ran"
        return self.outcome


class SampleQueue:
    """The sample requests queued on the worker. The first to run takes the ones queued behind it that serve the same
    weights (at most SHARED_CALL), so one engine call samples them all (the cookbook sends a step's prompts as one
    request each); those answer what that call gave them when their turn comes. A sampler's weights never change,
    so a request answered early answers what it would have in its turn."""

    def __init__(self):
        self.waiting: list[Queued] = []
        self.lock = threading.Lock()

    def add(self, sampler_id: str, sampler: Sampler, request) -> Queued:
        queued = Queued(sampler_id, sampler, request)
        with self.lock:
            self.waiting.append(queued)
        return queued

    def take(self, first: Queued) -> list[Queued]:
        """`first` and the waiting requests on its weights, oldest first; [] when a call before it took it."""
        weights = (first.sampler.base_name, first.sampler.weights_key)
        with self.lock:
            if first not in self.waiting:
                return []
            mine = [q for q in self.waiting if (q.sampler.base_name, q.sampler.weights_key) == weights]
            taken = [first, *[q for q in mine if q is not first][: SHARED_CALL - 1]]
            self.waiting = [q for q in self.waiting if q not in taken]
        return taken

    def drop_session(self, prefix: str) -> None:
        """Forget the waiting requests of an ended session's samplers (their futures were cancelled)."""
        with self.lock:
            self.waiting = [q for q in self.waiting if not q.sampler_id.startswith(prefix)]


@dataclass
class Ask:
    """One sample request, checked: the prompt's tokens, the engine's sampling (the request's own seed, as
    `seeds`), its stops (applied to the engine's sequences here) and whether it wants prompt log-probs."""

    tokens: list[int]
    sampling: Sampling  # without seeds: the asks of one sampling share an engine call
    seed: int | None  # the request's own, as its only prompt would draw (relayrl/rollout/seeds.py)
    stop_strings: list[str]
    stop_ids: set[int]
    prompt_logprobs: bool


def checked(served: Served, request) -> Ask:
    """An SDK `SampleRequest` as an Ask; a request the model cannot serve raises UserError."""
    from relayrl.rollout.seeds import request_seed
    from relayrl.types import Sampling

    tokens = prompt_tokens(request.prompt, served.vocab)
    params = request.sampling_params
    stop_strings, stop_ids = split_stop(params.stop)
    max_tokens = params.max_tokens if params.max_tokens is not None else 16
    if served.context is not None and len(tokens) + max_tokens > served.context:
        raise UserError(
            f"prompt: {len(tokens)} tokens + max_tokens={max_tokens} exceed the model's context of "
            f"{served.context} tokens"
        )
    if request.num_samples < 1:
        raise UserError(f"num_samples={request.num_samples}: must be at least 1")
    sampling = Sampling(
        n=request.num_samples,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=max_tokens,
    )
    seed = request_seed(params.seed, 0, request.num_samples)
    return Ask(tokens, sampling, seed, stop_strings, stop_ids, bool(request.prompt_logprobs))


def sample(served: Served, asks: list[Ask]) -> list[tuple[list[Sequence], list[float] | None]]:
    """(sequences, prompt log-probs or None) per ask; asks of the same sampling share one engine call, in which
    each sample draws from its own seeded stream as it would alone."""
    engine = served.engine
    results: list[tuple[list[Sequence], list[float] | None]] = []
    for ask in asks:
        prompt_logprobs = [math.nan, *engine.prompt_logprobs(ask.tokens)] if ask.prompt_logprobs else None
        results.append(([], prompt_logprobs))
    for indices in _shared_calls(asks):
        sampling = dataclasses.replace(asks[indices[0]].sampling, seeds=tuple(asks[i].seed for i in indices))
        prompts = [Prompt(id=f"sample-{i}", text="", token_ids=asks[i].tokens) for i in indices]
        rollouts = engine.generate(prompts, sampling, engine.version)
        for row, i in enumerate(indices):
            ask, mine = asks[i], rollouts[row * sampling.n : (row + 1) * sampling.n]
            sequences = [_sequence(r.response_ids, r.behaviour_logprobs, r.finish_reason, ask.stop_ids) for r in mine]
            results[i] = ([_cut_at_strings(q, ask.stop_strings, served.tokenizer) for q in sequences], results[i][1])
    return results


def _shared_calls(asks: list[Ask]) -> list[list[int]]:
    """The asks' indices grouped by their sampling (max_tokens 0 samples nothing)."""
    calls: dict[Sampling, list[int]] = {}
    for i, ask in enumerate(asks):
        if ask.sampling.max_tokens > 0:
            calls.setdefault(ask.sampling, []).append(i)
    return list(calls.values())


def prompt_tokens(prompt, vocab: int) -> list[int]:
    tokens = prompt.to_ints()
    if not tokens:
        raise UserError("prompt: no tokens")
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise UserError(f"prompt: token {bad[0]} is outside the vocabulary (size {vocab})")
    return tokens


def split_stop(stop) -> tuple[list[str], set[int]]:
    if stop is None:
        return [], set()
    items = [stop] if isinstance(stop, str) else list(stop)
    return [s for s in items if isinstance(s, str)], {s for s in items if isinstance(s, int)}


def _sequence(ids: list[int], logprobs: list[float], finish: str, stop_ids: set[int]) -> Sequence:
    for i, token in enumerate(ids):
        if token in stop_ids:
            return Sequence(ids[: i + 1], logprobs[: i + 1], stopped=True)
    return Sequence(ids, logprobs, stopped=finish == "stop")


def _cut_at_strings(seq: Sequence, stops: list[str], tokenizer) -> Sequence:
    """`seq` up to the token whose text completes the first stop string (kept), or unchanged."""
    if not stops or not any(stop in tokenizer.decode(seq.tokens) for stop in stops):
        return seq
    for end in range(1, len(seq.tokens) + 1):
        text = tokenizer.decode(seq.tokens[:end])
        if any(stop in text for stop in stops):
            logprobs = None if seq.logprobs is None else seq.logprobs[:end]
            return Sequence(seq.tokens[:end], logprobs, stopped=True)
    return seq
