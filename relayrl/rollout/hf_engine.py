"""HF transformers `generate` rollout engine: the fallback for models vLLM cannot serve (~5x slower here).

Behaviour log-probs come from `generate`'s processed scores (after temperature/top-p/top-k warpers), the
same distribution vLLM reports with `processed_logprobs`. `generate` samples from torch's global RNG, which
a local learner in this process shares: every call runs inside `torch.random.fork_rng`, seeded from the
request's seed (or this engine's own generator), so the learner's random stream is never moved.

Sampling runs `decode`, generate's own loop written out: the same model calls (KV cache, positions from the
left padding, last-position logits), the same processors in generate's order; drawing from torch's generator as
generate does, its tokens and scores equal `generate`'s (a test compares them). The engine runs it with one
generator per row instead, seeded per request as vLLM seeds them, so a sample does not depend on the batch it
shares (a multi-turn turn batched with whichever turns arrived with it draws the same tokens). It drops generate's per-call and
per-token set-up (config validation, processor and stopping-criteria lists, kwarg updates): on the small-batch
peer regime (0.8M params, 8 x 8, <= 8 tokens) generate 21.0 -> 19.2 ms, a step 0.967x; a small gain, kept because
the loop is exact. Requests with stop strings still go through `generate`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from relayrl.data.vision import vision_token_ids
from relayrl.errors import ConfigError
from relayrl.rollout.seeds import prompt_seeds
from relayrl.types import ImageBatch, PartialSample, Prompt, Rollout, Sampling


class HFEngine:
    def __init__(self, model_path: str, dtype: str = "float32"):
        """`dtype`: the weights' (rollout.dtype as relayrl/rollout/build.py resolves it: bf16 on a GPU, fp32 on CPU)."""
        from transformers import AutoTokenizer

        from relayrl.models.loading import load_causal_lm

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = load_causal_lm(model_path, self.device, key="rollout model", dtype=getattr(torch, dtype)).eval()
        self.params = dict(self.model.named_parameters())  # load_weights' targets (the same tensors every push)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.suppressed = vision_token_ids(model_path)  # never sampled (the learner leaves them out too)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_id = self.tokenizer.eos_token_id
        self.version = 0
        self.rng = torch.Generator()  # seeds for unseeded requests; never the global generator
        self.rng.seed()

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(2**62, (), generator=self.rng))
        devices = [torch.cuda.current_device()] if self.device == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the global state is restored on exit
            torch.manual_seed(seed)
            return self._generate(prompts, sampling, version)

    def _generate(self, prompts: list[Prompt], sampling: Sampling, version: int) -> list[Rollout]:
        width = max(len(p.token_ids) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate expects
            input_ids[row, width - len(prompt.token_ids) :] = torch.tensor(prompt.token_ids)
            attention[row, width - len(prompt.token_ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        images = ImageBatch([p.image_inputs for p in prompts])
        if sampling.stop:  # stop strings: generate's own criteria
            new_tokens, picked = self._generate_hf(input_ids, attention, sampling, images.batch(self.device))
        else:
            streams = self._row_streams(prompts, sampling)
            with_images = images.repeat(sampling.n).batch(self.device)
            new_tokens, picked = self._decode(input_ids, attention, sampling, streams, with_images)
        return self._rollouts(prompts, new_tokens, picked, sampling, version)

    def _generate_hf(self, input_ids, attention, sampling: Sampling, images=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`generate` itself, returning what `_decode` returns (`images`: the prompts' image tensors, joined)."""
        greedy = sampling.temperature == 0
        # transformers types generate's self as its GenerativePreTrainedModel protocol, which pyright does not
        # match against the auto class's return type
        out = self.model.generate(  # pyright: ignore[reportAttributeAccessIssue]
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy or sampling.top_k <= 0 else sampling.top_k,
            num_return_sequences=sampling.n,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=sampling.min_tokens or None,
            stop_strings=list(sampling.stop) or None,
            suppress_tokens=list(self.suppressed) or None,
            tokenizer=self.tokenizer if sampling.stop else None,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            output_scores=True,
            return_dict_in_generate=True,
            **(images or {}),
        )
        new_tokens = out.sequences[:, input_ids.shape[1] :].cpu()
        logprobs = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1).cpu()
        return new_tokens, logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)

    def _decode(
        self,
        input_ids,
        attention,
        sampling: Sampling,
        streams: list[torch.Generator] | None = None,
        images: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """generate's sampling loop for `input_ids` [P, L] (left-padded): (new tokens [P*n, T], their log-probs under
        the processed scores [P*n, T]); a finished row continues with padding, as in generate. With `streams`
        (one generator per row) each row draws from its own; without, every row from torch's global generator,
        as generate draws. `images`: the rows' image tensors (already n per prompt), read by the first forward."""
        from transformers import DynamicCache

        ids, mask = input_ids.repeat_interleave(sampling.n, 0), attention.repeat_interleave(sampling.n, 0)
        processors = self._processors(sampling, ids.shape[1])
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        unfinished = torch.ones(ids.shape[0], dtype=torch.long, device=ids.device)
        step_ids, tokens, logprobs = ids, [], []
        for _ in range(sampling.max_tokens):
            extra: dict = (images or {}) if not tokens else {}  # the prompt's forward reads the images; then the cache
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **extra,
            )
            scores = processors(ids, out.logits[:, -1].to(copy=True, dtype=torch.float32))  # pyright: ignore[reportArgumentType]
            if sampling.temperature == 0:
                chosen = torch.argmax(scores, dim=-1)
            elif streams:  # each row from its own stream: what it draws does not depend on the rows beside it
                probs = torch.softmax(scores, dim=-1)
                chosen = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, streams)])
            else:
                chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            chosen = chosen * unfinished + self.pad_id * (1 - unfinished)
            tokens.append(chosen)
            logprobs.append(torch.log_softmax(scores, -1).gather(-1, chosen[:, None]).squeeze(-1))
            ids = torch.cat([ids, chosen[:, None]], dim=-1)
            unfinished = unfinished & (chosen != self.eos_id).long()
            if not unfinished.any():
                break
            step_ids, positions = chosen[:, None], positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        return torch.stack(tokens, 1).cpu(), torch.stack(logprobs, 1).cpu()

    def _row_streams(self, prompts: list[Prompt], sampling: Sampling) -> list[torch.Generator]:
        """One generator per sampled row (prompt-major, n per prompt), seeded as vLLM seeds the request's samples
        (relayrl/rollout/seeds.py); an unseeded request draws its seed from the engine's own generator. (`generate`
        itself, used for stop strings, draws every row from one stream: its samples depend on the batch.)"""
        if sampling.temperature == 0:
            return []
        streams = []
        for seed in prompt_seeds(sampling, len(prompts)):
            base = seed if seed is not None else int(torch.randint(2**62, (), generator=self.rng))
            streams += [torch.Generator(self.device).manual_seed(base + j) for j in range(sampling.n)]
        return streams

    def _processors(self, sampling: Sampling, prompt_width: int):
        """generate's logits processors for these settings, in its order (length rules, then the warpers)."""
        from transformers.generation import logits_process as g  # their home: `generation` exports them lazily

        eos = torch.tensor([self.eos_id], device=self.device)
        chain = g.LogitsProcessorList()
        if self.suppressed:  # first, as vLLM applies a logit bias before temperature and top-k/top-p
            chain.append(g.SuppressTokensLogitsProcessor(list(self.suppressed), device=self.device))
        if sampling.min_tokens:
            chain.append(
                g.MinNewTokensLengthLogitsProcessor(prompt_width, sampling.min_tokens, eos, device=self.device)
            )
        if sampling.temperature not in (0, 1.0):
            chain.append(g.TemperatureLogitsWarper(sampling.temperature))
        if sampling.temperature != 0 and sampling.top_k > 0:
            chain.append(g.TopKLogitsWarper(sampling.top_k))
        if sampling.temperature != 0 and sampling.top_p < 1.0:
            chain.append(g.TopPLogitsWarper(sampling.top_p))
        return chain

    def _rollouts(self, prompts, tokens, logprobs, sampling: Sampling, version: int) -> list[Rollout]:
        """One Rollout per row of `tokens`/`logprobs` [P*n, T] (prompt-major), cut at EOS; the texts decoded in one
        batch call (a call per sample cost ~5% of a small step)."""
        kept, finishes = [], []
        for ids in tokens.tolist():
            finish = "length"
            if self.eos_id in ids:
                ids, finish = ids[: ids.index(self.eos_id) + 1], "stop"
            elif sampling.stop and self.pad_id in ids:  # a row stopped by a stop string is padded after it
                ids, finish = ids[: ids.index(self.pad_id)], "stop"
            kept.append(ids)
            finishes.append(finish)
        texts = self.tokenizer.batch_decode(kept, skip_special_tokens=True)
        rollouts = []
        for row, (ids, text, finish, row_logprobs) in enumerate(zip(kept, texts, finishes, logprobs.tolist())):
            for stop in sampling.stop:
                if stop in text:
                    text, finish = text[: text.index(stop)], "stop"
            rollouts.append(
                Rollout(
                    prompt=prompts[row // sampling.n],
                    group_index=row % sampling.n,
                    response_ids=ids,
                    response_text=text,
                    behaviour_logprobs=row_logprobs[: len(ids)],
                    finish_reason=finish,
                    versions=[version] * len(ids),
                )
            )
        return rollouts

    def generate_until(self, samples: list[PartialSample], sampling: Sampling, groups_needed: int):
        raise ConfigError(
            "train.partial_rollouts continues responses inside the engine, which HF generate cannot: "
            "use rollout.engine=vllm or set train.partial_rollouts=0"
        )

    @torch.no_grad()
    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 at temperature 1 (the parity probe's engine side)."""
        ids = torch.tensor([token_ids], device=self.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

    def sleep(self, level: int) -> None:
        """Free the device between phases: the weights wait in CPU memory (either level: generate allocates its
        cache per call, so there is no KV cache to drop)."""
        self.model.to("cpu")  # pyright: ignore[reportArgumentType] - transformers' wrapped .to, read unbound
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        if tags is None or "weights" in tags:
            self.model.to(self.device)  # pyright: ignore[reportArgumentType] - as in __init__

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        params = self.params
        with torch.no_grad():
            for name, tensor in named_tensors:
                params[name].copy_(tensor)
        self.version = version
