"""What the service holds and what each route does with it: sessions (with their last heartbeat), training models
(`<session>:train:<n>`, the id the SDK derives itself), sampler weights saved by `save_weights_for_sampler`
(`tinker://<model>/sampler_weights/<name>`; of the unnamed ones, `save_weights_and_get_sampling_client`'s, the
newest KEEP_EPHEMERAL per model), sampling sessions, and `save_state` checkpoints
(`tinker://<model>/weights/<name>`, a directory under `state_dir`). Work that touches a model runs on the
futures' worker (relayrl/service/futures.py); a route here returns what the SDK's response type holds. A session
that ends (its client's `close`, or no heartbeat for SESSION_TIMEOUT_S) frees what it held (`end_session`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from pathlib import Path

import torch

from relayrl.service import mismatch, sampling, wire
from relayrl.service.errors import UserError
from relayrl.service.futures import Completions, Futures
from relayrl.service.run_log import RunLog, forward_backward_figures, timed
from relayrl.service.settings import ServiceSettings
from relayrl.service.training import TrainedModel, lora_settings, read_meta

log = logging.getLogger("relayrl.service")

PREFIX = "tinker://"
SESSION_TIMEOUT_S = 120.0  # the SDK warns after 2 minutes of failed heartbeats that the session will end
KEEP_EPHEMERAL = 4  # unnamed sampler weights kept per model (an RL loop saves one per step); named ones stay


class Service:
    def __init__(self, bases: dict[str, str], state_dir: str | Path, settings: ServiceSettings):
        self.bases = bases  # base model name -> local HF directory
        self.state_dir = Path(state_dir)
        self.futures = Futures()
        self.completions = Completions()  # the samples' retrieve_futures queues
        self.sessions: dict[str, float] = {}  # session id -> last heartbeat (time.time())
        self.session_numbers = itertools.count(1)
        self.expired: dict[str, str] = {}  # ended sessions (why): they answer 410
        self.models: dict[str, TrainedModel] = {}
        self.snapshots: dict[str, dict[str, torch.Tensor]] = {}  # sampler path -> merged weights
        self.snapshot_base: dict[str, str] = {}
        self.samplers: dict[str, sampling.Sampler] = {}
        self.sample_queue = sampling.SampleQueue()  # sample requests on the worker, sharing engine calls
        self.engines = sampling.Engines(bases, settings)
        self.samples = mismatch.Samples()  # the settings each sequence was sampled at, for the mismatch
        self.run_log = RunLog(settings.run_dir, settings.config_yaml, settings.backends, settings.params)
        self.instance = secrets.token_hex(
            4
        )  # session ids (hence model ids and checkpoint paths) differ across restarts

    # sessions -------------------------------------------------------------------------------------------------
    def create_session(self) -> str:
        self.expire_sessions()
        session_id = f"{self.instance}-{next(self.session_numbers)}"
        self.sessions[session_id] = time.time()
        return session_id

    def heartbeat(self, session_id: str) -> None:
        self.expire_sessions()
        self.session(session_id)
        self.sessions[session_id] = time.time()

    def session(self, session_id: str) -> str:
        if session_id in self.expired:
            raise UserError(f"session_id={session_id!r}: ended ({self.expired[session_id]})", status=410)
        if session_id not in self.sessions:
            raise UserError(f"session_id={session_id!r}: no such session", status=404)
        return session_id

    def expire_sessions(self, now: float | None = None) -> list[str]:
        """Free what a client that disappeared held: a session with no heartbeat for SESSION_TIMEOUT_S (the SDK
        beats every 10 s) ends (`end_session`). Runs whenever a session is created or beats."""
        now = time.time() if now is None else now
        gone = [sid for sid, beat in self.sessions.items() if now - beat > SESSION_TIMEOUT_S]
        for session_id in gone:
            self.end_session(session_id, f"no heartbeat for {SESSION_TIMEOUT_S:.0f} s")
        return gone

    def end_session(self, session_id: str, why: str) -> None:
        """A session that finished (the SDK's `ServiceClient.close`) or expired loses its queued requests
        (cancelled), then, on the worker after what is running, its training models, sampling sessions and unnamed
        sampler weights. Named sampler weights and save_state checkpoints stay: other clients may name them."""
        self.session(session_id)
        del self.sessions[session_id]
        self.expired[session_id] = why
        cancelled = self.futures.cancel_owned(session_id)
        log.warning("session %s: %s; freeing it (%d queued requests cancelled)", session_id, why, cancelled)
        self.futures.run(lambda: self.drop_session(session_id))

    def drop_session(self, session_id: str) -> None:
        prefix = f"{session_id}:"
        for table in (self.models, self.samplers):
            for key in [key for key in table if key.startswith(prefix)]:
                del table[key]
        self.completions.drop_session(prefix)
        self.sample_queue.drop_session(prefix)
        unnamed = f"{PREFIX}{prefix}"
        for key in [key for key in self.snapshots if key.startswith(unnamed) and "/ephemeral-" in key]:
            del self.snapshots[key]

    def submit(self, owner: str | None, fn) -> str:
        """Queue `fn` as a request of the session `owner` names (a session, model or sampler id)."""
        return self.futures.submit(fn, owner=(owner or "").split(":")[0])

    def capabilities(self) -> list[dict]:
        from relayrl.models.loading import context_length

        return [
            {"model_name": name, "max_context_length": context_length(path), "trainable": True, "sampleable": True}
            for name, path in self.bases.items()
        ]

    def base_path(self, name: str | None) -> str:
        if name not in self.bases:
            served = ", ".join(self.bases)
            raise UserError(f"base_model={name!r}: not served here (served: {served}; `relayrl serve --model`)")
        return self.bases[name]

    # training ------------------------------------------------------------------------------------------------
    def model(self, model_id: str) -> TrainedModel:
        if model_id not in self.models:
            raise UserError(f"model_id={model_id!r}: no such model", status=404)
        return self.models[model_id]

    def create_model(self, request) -> str:
        """Check the request now (a bad one answers at once); load the model on the worker."""
        session_id = self.session(request.session_id)
        path = self.base_path(request.base_model)
        lora = request.lora_config
        settings = None if lora is None else lora_settings(lora.rank, lora.train_attn, lora.train_mlp)
        model_id = f"{session_id}:train:{request.model_seq_id}"

        def load() -> dict:
            seed = 0 if lora is None or lora.seed is None else lora.seed
            self.models[model_id] = TrainedModel(model_id, request.base_model, path, settings, seed)
            return {"model_id": model_id, "type": "create_model"}

        return self.submit(session_id, load)

    def info(self, model_id: str) -> dict:
        model = self.model(model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {"model_name": model.base_name, "tokenizer_id": self.bases[model.base_name]},
            "is_lora": model.lora is not None,
            "lora_rank": model.lora.rank if model.lora else None,
            "model_name": model.base_name,
        }

    def forward_backward(self, call: wire.ForwardBackwardCall) -> str:
        model = self.model(call.model_id)

        def run(figures: dict) -> bytes:
            outputs, metrics = model.forward_backward(call, [self.samples.to_score(ex) for ex in call.examples])
            figures |= forward_backward_figures(call, outputs, metrics, self.samples)
            return wire.forward_backward_output([{"logprobs": out["logprobs"]} for out in outputs], metrics)

        route = "forward" if call.forward_only else "forward_backward"
        return self.submit(call.model_id, timed(self.run_log, route, call.model_id, run))

    def optim_step(self, request) -> str:
        model = self.model(request.model_id)
        from tinker import types

        if not isinstance(request.optim_params, types.AdamParams):  # the SDK's union leaves room for others
            raise UserError(f"optim_params: {type(request.optim_params).__name__} is not served here, only AdamParams")

        def step(figures: dict) -> dict:
            metrics = model.optim_step(request.optim_params)
            figures |= metrics
            return {"metrics": metrics}

        return self.submit(request.model_id, timed(self.run_log, "optim_step", request.model_id, step))

    # sampler weights and sampling sessions -------------------------------------------------------------------
    def save_weights_for_sampler(self, request) -> str:
        model = self.model(request.model_id)
        if request.path is not None:
            key = f"{PREFIX}{model.model_id}/sampler_weights/{request.path}"
        else:
            key = f"{PREFIX}{model.model_id}/sampler_weights/ephemeral-{request.seq_id}"
        session_id = model.model_id.split(":")[0]

        def save() -> dict:
            self.snapshots[key] = model.sampler_weights()
            self.snapshot_base[key] = model.base_name
            if request.path is None:
                self.drop_old_ephemeral(model.model_id)
            if request.path is not None:
                return {"path": key, "type": "save_weights_for_sampler"}
            sampler_id = self.new_sampler(session_id, f"w{request.sampling_session_seq_id}", model.base_name, key)
            return {"path": None, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

        return self.submit(model.model_id, save)

    def drop_old_ephemeral(self, model_id: str) -> None:
        prefix = f"{PREFIX}{model_id}/sampler_weights/ephemeral-"
        ephemeral = [key for key in self.snapshots if key.startswith(prefix)]  # in insertion order: oldest first
        for key in ephemeral[:-KEEP_EPHEMERAL]:
            del self.snapshots[key]

    def new_sampler(self, session_id: str, seq: str, base_name: str, weights_key: str | None) -> str:
        sampler_id = f"{session_id}:sample:{seq}"
        self.samplers[sampler_id] = sampling.Sampler(base_name, weights_key)
        return sampler_id

    def create_sampling_session(self, request) -> str:
        session_id = self.session(request.session_id)
        if request.model_path is not None:
            if request.model_path not in self.snapshots:
                raise UserError(f"model_path={request.model_path!r}: no sampler weights saved under it", status=404)
            base = self.snapshot_base[request.model_path]
        else:
            self.base_path(request.base_model)
            base = request.base_model
        return self.new_sampler(session_id, str(request.sampling_session_seq_id), base, request.model_path)

    def sampler(self, sampler_id: str | None) -> sampling.Sampler:
        if sampler_id not in self.samplers:
            raise UserError(f"sampling_session_id={sampler_id!r}: no such sampling session", status=404)
        return self.samplers[sampler_id]

    def sample(self, request) -> tuple[str, list[str]]:
        sampler_id = request.sampling_session_id
        queued = self.sample_queue.add(sampler_id or "", self.sampler(sampler_id), request)

        def run(figures: dict) -> bytes:
            self.run_samples(self.sample_queue.take(queued))
            sequences, prompt_logprobs = queued.answer()
            figures["prompt_tokens"] = float(len(request.prompt.to_ints()))
            figures["tokens"] = float(sum(len(seq.tokens) for seq in sequences))
            return wire.sample_response(sequences, prompt_logprobs)

        owner = sampler_id or ""
        request_id = self.submit(sampler_id, timed(self.run_log, "sample", owner, run))
        clone = (
            request.seq_id or 0
        ) // 1_000_000_000  # the SDK numbers a cloned SamplingClient's requests from clone * 1e9
        self.completions.watch(self.futures, (owner, clone), request_id)
        n = 0 if request.sampling_params.max_tokens == 0 else request.num_samples
        return request_id, [f"{request_id}:{i}" for i in range(n)]

    def run_samples(self, batch: list[sampling.Queued]) -> None:
        """Sample the queued requests `batch` (one sampler's weights) in the fewest engine calls, each its outcome."""
        if not batch:
            return
        sampler = batch[0].sampler
        if sampler.weights_key is not None and sampler.weights_key not in self.snapshots:
            for queued in batch:
                queued.outcome = UserError(
                    f"sampling_session_id={queued.sampler_id!r}: its weights were dropped (the service keeps the "
                    f"newest {KEEP_EPHEMERAL} unnamed sampler weights per model; save_weights_for_sampler(name) "
                    "keeps them)"
                )
            return
        try:
            served = self.engines.serving(sampler, self.snapshots)
        except Exception as err:  # noqa: BLE001 - each request answers it
            for queued in batch:
                queued.outcome = err
            return
        asks = []
        for queued in batch:
            try:
                asks.append((queued, sampling.checked(served, queued.request)))
            except UserError as err:
                queued.outcome = err
        try:
            outcomes = sampling.sample(served, [ask for _, ask in asks])
        except Exception as err:  # noqa: BLE001 - each request answers it
            outcomes = [err] * len(asks)
        for (queued, ask), outcome in zip(asks, outcomes):
            queued.outcome = outcome
            if not isinstance(outcome, Exception):
                at = mismatch.SampledAt.of(queued.request.sampling_params)  # pyright: ignore[reportAttributeAccessIssue]
                self.samples.add(ask.tokens, outcome[0], at)

    # checkpoints ---------------------------------------------------------------------------------------------
    def save_state(self, request) -> str:
        model = self.model(request.model_id)
        name = request.path or f"step-{model.steps}"
        if "/" in name or name.startswith("."):
            raise UserError(f"path={name!r}: a checkpoint name, without '/'")
        path = f"{PREFIX}{model.model_id}/weights/{name}"

        def save() -> dict:
            model.save_state(self.checkpoint_dir(path))
            return {"path": path, "type": "save_weights"}

        return self.submit(model.model_id, save)

    def checkpoint_dir(self, path: str) -> Path:
        if not path.startswith(PREFIX) or "/weights/" not in path:
            raise UserError(f"path={path!r}: not a save_state path (tinker://<model_id>/weights/<name>)")
        model_id, _, name = path[len(PREFIX) :].partition("/weights/")
        return self.state_dir / model_id.replace(":", "_") / name

    def load_state(self, request) -> str:
        source = self.checkpoint_dir(request.path)
        if not (source / "meta.json").is_file():
            raise UserError(f"path={request.path!r}: no checkpoint saved there", status=404)
        if request.model_id is not None:
            model = self.model(request.model_id)
        else:  # create_training_client_from_state: a new model on the checkpoint's base and adapter
            session_id = self.session(request.session_id)
            meta = read_meta(source)
            name = request.base_model or meta["base_model"]
            path = self.base_path(name)
            settings = None if meta["lora_rank"] is None else lora_settings(meta["lora_rank"])
            if settings is not None:
                settings.target_modules = tuple(meta["target_modules"])
            model_id = f"{session_id}:train:{request.model_seq_id}"
            model = None

        def load() -> dict:
            target = model
            if target is None:
                target = self.models[model_id] = TrainedModel(model_id, name, path, settings)
            target.load_state(source, request.optimizer)
            return {"path": request.path, "model_id": target.model_id, "type": "load_weights"}

        return self.submit(request.model_id or request.session_id, load)
