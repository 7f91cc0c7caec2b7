"""HF transformers `generate` rollout engine: the fallback for models vLLM cannot serve (~5x slower here).

Behaviour log-probs come from `generate`'s processed scores (after temperature/top-p/top-k warpers), the
same distribution vLLM reports with `processed_logprobs`. `generate` samples from torch's global RNG, which
a local learner in this process shares: every call runs inside `torch.random.fork_rng`, seeded from the
request's seed (or this engine's own generator), so the learner's random stream is never moved.
"""

from __future__ import annotations

from typing import Iterable

import torch

from relayrl.errors import ConfigError
from relayrl.rollout.base import PartialSample, Sampling
from relayrl.types import Prompt, Rollout


class HFEngine:
    def __init__(self, model_path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
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
        greedy = sampling.temperature == 0
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy or sampling.top_k <= 0 else sampling.top_k,
            num_return_sequences=sampling.n,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=sampling.min_tokens or None,
            stop_strings=list(sampling.stop) or None,
            tokenizer=self.tokenizer if sampling.stop else None,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new_tokens = out.sequences[:, width:].cpu()
        logprobs = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1).cpu()
        picked = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return [
            self._rollout(prompts[i // sampling.n], i % sampling.n, new_tokens[i], picked[i], sampling, version)
            for i in range(new_tokens.shape[0])
        ]

    def _rollout(self, prompt, index, tokens, logprobs, sampling, version) -> Rollout:
        ids = tokens.tolist()
        finish = "length"
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id) + 1]
            finish = "stop"
        elif sampling.stop and self.pad_id in ids:  # a row stopped by a stop string is padded after it
            ids = ids[: ids.index(self.pad_id)]
            finish = "stop"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for stop in sampling.stop:
            if stop in text:
                text, finish = text[: text.index(stop)], "stop"
        return Rollout(
            prompt=prompt,
            group_index=index,
            response_ids=ids,
            response_text=text,
            behaviour_logprobs=logprobs[: len(ids)].tolist(),
            finish_reason=finish,
            versions=[version] * len(ids),
        )

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

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                params[name].copy_(tensor)
        self.version = version
