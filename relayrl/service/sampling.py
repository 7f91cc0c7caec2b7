"""Sampling for the SDK's `SamplingClient`: one relayrl HF engine per base model (relayrl/rollout/hf_engine.py),
whose weights are swapped for the sampler a request names, through the engine's own push
(`load_weights(named_tensors, version)`, the one relayrl's learners use), and only when they differ from what the
engine holds.

A sampler's weights are a `save_weights_for_sampler` copy (the trained model merged, relayrl/service/training.py)
or the base's own. `sample` maps the SDK's `SamplingParams` onto relayrl's `Sampling` and samples with the engine's
own loop (one seeded stream per sample, so a sample does not depend on the requests beside it); a stop token id
cuts a sequence after the first one it samples, a stop string after the token that completes it in the decoded
text (transformers' stop-string criteria cannot take strings outside a tokenizer's vocabulary, such as
role_colon's "\n\nUser:" on a character tokenizer). EOS always stops, as in the engine.
The sequences' log-probs are the engine's (after temperature), so at temperature 1 they are the model's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from relayrl.service.errors import UserError
from relayrl.service.wire import Sequence


@dataclass
class Sampler:
    """What a sampling session serves: a base model and the weights to put in its engine (None: the base's)."""

    base_name: str
    weights_key: str | None  # the sampler path whose weights it serves; None: the base model


class Engines:
    def __init__(self, bases: dict[str, str]):
        self.bases = bases  # name -> local directory
        self.engines: dict[str, object] = {}
        self.loaded: dict[str, str | None] = {}  # base name -> the weights key its engine holds
        self.base_weights: dict[str, dict[str, torch.Tensor]] = {}
        self.versions = 0

    def engine(self, base_name: str):
        if base_name not in self.engines:
            from relayrl.rollout.hf_engine import HFEngine

            engine = HFEngine(self.bases[base_name])
            self.engines[base_name] = engine
            self.loaded[base_name] = None
            self.base_weights[base_name] = {n: p.detach().clone() for n, p in engine.params.items()}
        return self.engines[base_name]

    def serving(self, sampler: Sampler, snapshots: dict[str, dict[str, torch.Tensor]]):
        """The base's engine, holding `sampler`'s weights."""
        engine = self.engine(sampler.base_name)
        if self.loaded[sampler.base_name] != sampler.weights_key:
            weights = (
                self.base_weights[sampler.base_name] if sampler.weights_key is None else snapshots[sampler.weights_key]
            )
            self.versions += 1
            engine.load_weights(weights.items(), self.versions)  # pyright: ignore[reportAttributeAccessIssue]
            self.loaded[sampler.base_name] = sampler.weights_key
        return engine


def sample(engine, request) -> tuple[list[Sequence], list[float] | None]:
    """(sequences, prompt log-probs or None) for an SDK `SampleRequest`."""
    from relayrl.types import Prompt, Sampling

    tokens = prompt_tokens(engine, request.prompt)
    params = request.sampling_params
    stop_strings, stop_ids = split_stop(params.stop)
    context = getattr(engine.model.config, "max_position_embeddings", None)
    max_tokens = params.max_tokens if params.max_tokens is not None else 16
    if context is not None and len(tokens) + max_tokens > context:
        raise UserError(
            f"prompt: {len(tokens)} tokens + max_tokens={max_tokens} exceed the model's context of {context} tokens"
        )
    if request.num_samples < 1:
        raise UserError(f"num_samples={request.num_samples}: must be at least 1")
    prompt_logprobs = None
    if request.prompt_logprobs:
        prompt_logprobs = [math.nan, *engine.prompt_logprobs(tokens)]
    if max_tokens == 0:
        return [], prompt_logprobs
    sampling = Sampling(
        n=request.num_samples,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=max_tokens,
        seed=params.seed,
    )
    rollouts = engine.generate([Prompt(id="sample", text="", token_ids=tokens)], sampling, engine.version)
    sequences = [_sequence(r.response_ids, r.behaviour_logprobs, r.finish_reason, stop_ids) for r in rollouts]
    return [_cut_at_strings(seq, stop_strings, engine.tokenizer) for seq in sequences], prompt_logprobs


def prompt_tokens(engine, prompt) -> list[int]:
    tokens = prompt.to_ints()
    vocab = engine.model.get_input_embeddings().weight.shape[0]
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
