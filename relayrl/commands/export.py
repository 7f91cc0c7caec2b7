"""`relayrl export CHECKPOINT --out DIR [--merge]`: a checkpoint as something other tools load.

A LoRA run's checkpoint holds the adapter only (`model/`: adapter_config.json + adapter_model.safetensors);
the base it applies to is the run's `model.path` (from the run's config.yaml). Without `--merge` the export
is that peft adapter, its `base_model_name_or_path` pointing at the base; with `--merge` it is the base with
the adapter merged in, a plain `save_pretrained` model with the base's tokenizer (what `relayrl eval --model`
and vLLM load). A full fine-tuning checkpoint is already a full model: it is copied, with the tokenizer.
CHECKPOINT may also be a run directory: its newest intact checkpoint is exported. `relayrl eval --model` takes
an exported adapter as it is (`models.loading.merged_model_dir`). A checkpoint of sharded learner ranks
(`placement.learner_ranks` > 1) holds `sharded/` (torch.distributed.checkpoint files) instead of `model/`: its
policy is read into the base's architecture in this one process (relayrl/learner/dist_checkpoint.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def register(commands) -> None:
    export = commands.add_parser("export", help="write a checkpoint as a peft adapter or a merged model")
    export.add_argument("checkpoint", metavar="CHECKPOINT", help="<run>/checkpoints/step_N, or a run directory")
    export.add_argument("--out", required=True, help="the directory to write")
    export.add_argument("--merge", action="store_true", help="LoRA: merge the adapter into the base model")
    export.set_defaults(fn=lambda args: print(export_checkpoint(args.checkpoint, args.out, args.merge)))


def export_checkpoint(checkpoint: str | Path, out: str | Path, merge: bool = False) -> str:
    from relayrl.models import lora
    from relayrl.models.loading import load_causal_lm, load_tokenizer
    from relayrl.run.checkpoint import find_checkpoint, run_config

    source = find_checkpoint(checkpoint)
    config, out = run_config(source), Path(out)
    model_dir, base = source / "model", config.model.path
    from relayrl.learner import dist_checkpoint

    if dist_checkpoint.is_sharded(source):  # written by W learner ranks
        dist_checkpoint.export_sharded(source, out, base, load_tokenizer(base))
        return f"wrote the full model of {source} (sharded checkpoint) to {out}"
    if not lora.is_adapter_dir(model_dir):
        shutil.copytree(model_dir, out, dirs_exist_ok=True)
        load_tokenizer(base).save_pretrained(out)
        return f"wrote the full model of {source} to {out}"
    if not merge:
        shutil.copytree(model_dir, out, dirs_exist_ok=True)
        settings = json.loads((out / "adapter_config.json").read_text())
        settings["base_model_name_or_path"] = str(base)
        (out / "adapter_config.json").write_text(json.dumps(settings, indent=2))
        return f"wrote the LoRA adapter of {source} (base {base}) to {out}"
    model = lora.add_adapter(load_causal_lm(base), config.model.lora)
    lora.load_adapter(model, model_dir)
    lora.save_merged(model, out)
    load_tokenizer(base).save_pretrained(out)
    return f"wrote {source}'s adapter merged into {base} to {out}"
