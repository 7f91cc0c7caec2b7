"""`relayrl export`: a LoRA checkpoint (adapter + optimizer state only) as a peft adapter or a merged model."""

import pytest
import torch

from relayrl.cli import main
from relayrl.commands.export import export_checkpoint
from relayrl.config import dump_config
from relayrl.errors import RelayError
from relayrl.learner.policy import PolicyLearner
from relayrl.models import lora
from relayrl.models.loading import load_causal_lm
from relayrl.placement.sections import learner_settings
from relayrl.run.checkpoint import save_checkpoint
from tests.unit.test_learner import _experience
from tests.unit.test_lora import _config


@pytest.fixture(scope="module")
def lora_run(random_model_dir, tmp_path_factory):
    """A run directory with its config.yaml and one LoRA checkpoint, and the learner that wrote it."""
    run = tmp_path_factory.mktemp("lora_run")
    config = _config(random_model_dir)
    (run / "config.yaml").write_text(dump_config(config))
    learner = PolicyLearner(learner_settings(config))
    learner.update(_experience(vocab=12))
    state = {"optimizer": learner.optimizer.state_dict()}
    checkpoint = save_checkpoint(run, 0, learner.model, state, keep=1)
    return run, checkpoint, learner


def test_checkpoint_holds_the_adapter_not_the_base(lora_run):
    _, checkpoint, learner = lora_run
    saved = sum(p.stat().st_size for p in (checkpoint / "model").iterdir())
    base_bytes = sum(p.numel() * 4 for p in learner.network.parameters() if not p.requires_grad)
    assert lora.is_adapter_dir(checkpoint / "model") and saved < base_bytes / 2


def test_export_merged_is_a_plain_model_equal_to_the_merge(lora_run, tmp_path):
    run, _, learner = lora_run
    (run / "model").mkdir(exist_ok=True)  # a finished run's merged model beside its checkpoints
    assert main(["export", str(run), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    loaded = dict(load_causal_lm(tmp_path / "merged").named_parameters())
    merged = dict(lora.merged_tensors(learner.model))
    assert all(torch.equal(loaded[k], merged[k]) for k in merged)
    assert (tmp_path / "merged" / "tokenizer.json").is_file()


def test_export_adapter_loads_with_peft_onto_its_base(lora_run, tmp_path, random_model_dir):
    from peft import PeftModel

    _, checkpoint, learner = lora_run
    export_checkpoint(checkpoint, tmp_path / "adapter")
    model = PeftModel.from_pretrained(load_causal_lm(random_model_dir), tmp_path / "adapter")
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, learner.model(input_ids=ids).logits, atol=1e-6)


def test_export_without_a_checkpoint_names_the_path(tmp_path):
    with pytest.raises(RelayError, match="no intact checkpoint"):
        export_checkpoint(tmp_path, tmp_path / "out")


def test_an_exported_adapter_is_merged_for_eval(lora_run, tmp_path):
    from relayrl.models.loading import merged_model_dir

    run, _, learner = lora_run
    export_checkpoint(run, tmp_path / "adapter")
    merged = merged_model_dir(tmp_path / "adapter")
    loaded = dict(load_causal_lm(merged).named_parameters())
    assert all(torch.allclose(loaded[k], v, atol=1e-6) for k, v in lora.merged_tensors(learner.model))
    assert merged_model_dir(run / "checkpoints") == str(run / "checkpoints")  # anything else is passed through
