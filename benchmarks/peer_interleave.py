"""peer_trl.py --interleave: relayrl and TRL trained in this one process, one optimizer step each in turn.

On a shared machine the load changes from minute to minute, so two runs made one after the other can differ
by 2-10x for reasons that are not theirs. Here the two runs alternate step by step and so see the same load:
TRL's `GRPOTrainer.train()` runs as in `peer_sides.run_trl`, and after each of its steps (once its step clock
has stopped) a callback runs one relayrl step. relayrl's side is `relayrl.controller.build_trainer` on the same
config `relayrl train` would read, stepped with `Trainer.step`, the loop's own step; its time is `time/step`
as in metrics.jsonl. Neither side moves the other's random streams: relayrl's HF engine samples inside
`torch.random.fork_rng` and its learner shuffles with its own generator, so TRL sees the global RNG it
would see alone (with `--engine vllm` this does not hold: vLLM seeds torch's global RNG when it starts and
sets up torch.distributed in this process, so TRL's samples differ from a run of its own). Both sides run with
this process's torch threads.

Left out: relayrl's before/after evaluation inside the run and its trackers (neither is in a step's time);
the final models are saved where the subprocess runs save them and scored by the same `relayrl eval`.
"""

from __future__ import annotations

import time
from pathlib import Path

from peer_sides import relayrl_summary, run_trl


def run_interleaved(config, relay_dir: Path, trl_dir: Path) -> tuple[dict, dict, list]:
    """(relayrl's stats, TRL's stats, TRL's first-batch samples): both trained with `config`, steps alternating."""
    from transformers import TrainerCallback

    from relayrl.controller import build_trainer

    start = time.perf_counter()
    trainer = build_trainer(config, overwrite=True)  # config.log.dir is relay_dir
    trainer.schedule = trainer.make_schedule()
    rows: list[dict] = []

    class RelayrlStep(TrainerCallback):
        """After each TRL step (its clock, registered first, has stopped): one relayrl step."""

        def on_step_end(self, args, state, control, **kwargs):
            rows.append(trainer.step(len(rows)))

    try:
        trl_stats, samples = run_trl(config, trl_dir, extra_callbacks=[RelayrlStep()])
        while len(rows) < config.train.steps:  # TRL stopped early: relayrl still does every step
            rows.append(trainer.step(len(rows)))
        trainer.schedule.close()
        trainer.learner.save(str(relay_dir), trainer.tokenizer)
    finally:
        trainer.close()
    relay = relayrl_summary(config, rows, time.perf_counter() - start, relay_dir)
    relay["own_eval"] = None
    return relay, trl_stats, samples
