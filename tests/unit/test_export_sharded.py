"""`relayrl export` of a sharded checkpoint (`sharded/` instead of `model/`, placement.learner_ranks > 1).

The checkpoint is written here in one process, in the format the ranks write (relayrl/learner/dist_checkpoint.py:
`torch.distributed.checkpoint` files of {"policy": {"model": ...}} under `sharded/`, inside an ordinary
checkpoint with its manifest); test_sharded_learner.py exports one written by two real ranks.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from relayrl.cli import main
from relayrl.config import dump_config
from relayrl.errors import RelayError
from relayrl.models.loading import load_causal_lm
from relayrl.run.checkpoint import find_checkpoint, save_checkpoint
from tests.unit.test_sharded_scenarios import config


class _Shards:
    """Stands in for the model in save_checkpoint, as dist_checkpoint's writer does."""

    def __init__(self, model):
        self.model = model

    def save_pretrained(self, target: Path) -> None:
        state = {"policy": {"model": self.model.state_dict()}}
        dcp.save(state, checkpoint_id=Path(target).parent / "sharded", no_dist=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_export_of_a_sharded_run_is_its_policy(random_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(config(random_model_dir)))
    trained = load_causal_lm(random_model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))  # not the base: the export must carry the checkpoint's weights
    checkpoint = save_checkpoint(run, 3, _Shards(trained), {"version": 3}, keep=1)
    assert not (checkpoint / "model").exists() and find_checkpoint(run) == checkpoint
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    exported = load_causal_lm(tmp_path / "out")
    for (name, got), (_, want) in zip(exported.named_parameters(), trained.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_a_checkpoint_without_weights_is_refused(tmp_path):
    save_checkpoint(tmp_path, 0, type("Nothing", (), {"save_pretrained": lambda self, t: None})(), {}, keep=1)
    with pytest.raises(RelayError, match="no intact checkpoint"):
        find_checkpoint(tmp_path)
