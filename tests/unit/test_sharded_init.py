"""Sharded learner ranks built without loading the model on ranks > 0 (rank 0 reads it into CPU memory and
broadcasts the shards), the critic's global normaliser, FSDP2's mixed-precision policy, and LoRA on sharded ranks
(CPU/gloo, a tiny fp32 model).

Two ranks are spawned once and, in one process group: build a GAE learner with a KL reference (policy,
reference and critic all sharded) while rank 1 cannot read any weights file (and every rank counts the weights
files it opens); gather its weights; take one
step; then take a step with bf16 parameters in the passes (FSDP2's MixedPrecisionPolicy over gloo); then LoRA
learners (the base and adapter sharded, the reference the base with the adapter disabled) resume a W=1
checkpoint (1 -> 2) and their own sharded one (2 -> 2) and push what sync.lora sends. Rank 0 writes the
results; the W=1 learners run here. Token counts differ between the ranks (30 and 36), so a critic
loss averaged per rank instead of divided by the global count gives another loss and other gradients.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayrl.placement.sections import learner_settings
from relayrl.sync.remote import free_port
from tests.unit.test_sharded_learner import run_ranks
from tests.unit.test_sharded_scenarios import WORLD, config, experience

GAE = ["algorithm.advantage=gae", "algorithm.kl.coef=0.1", "critic.lr=1e-2"]
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "train.lr=1e-2", "algorithm.kl.coef=0.1", "sync.lora=merged"]


def gae_experience():
    exp = experience(seed=0)
    exp.returns = (exp.rewards[:, None] + 0.1 * torch.arange(exp.loss_mask.shape[1])) * exp.loss_mask
    return exp


def full_weights(learner) -> dict[str, dict[str, torch.Tensor]]:
    """policy, reference and critic: every parameter and buffer as a full tensor (a gather on sharded ranks)."""
    out = {}
    models = {"policy": learner.policy.model, "reference": learner.policy.reference, "critic": learner.critic.model}
    for role, model in models.items():
        tensors = {n: getattr(p, "full_tensor", p.detach)().detach().clone() for n, p in model.named_parameters()}
        tensors.update({f"buffer:{n}": b.clone() for n, b in model.named_buffers()})
        out[role] = tensors
    return out


def count_safetensors_opens() -> list[str]:
    """Every weights file this process opens from now on: transformers reads a checkpoint only through
    safetensors' `safe_open` (transformers.modeling_utils), so each call is counted with its file."""
    import safetensors
    from transformers import modeling_utils

    opened: list[str] = []
    real = modeling_utils.safe_open

    def counted(filename, *args, **kwargs):
        opened.append(str(filename))
        return real(filename, *args, **kwargs)

    modeling_utils.safe_open = counted
    safetensors.safe_open = counted
    return opened


def local_shares(learner) -> dict[str, float]:
    """policy, reference and critic: the elements this rank holds over the model's (1/W when sharded evenly)."""
    models = {"policy": learner.policy.model, "reference": learner.policy.reference, "critic": learner.critic.model}
    return {
        role: sum(p.to_local().numel() for p in model.parameters()) / sum(p.numel() for p in model.parameters())
        for role, model in models.items()
    }


def step(learner, exp) -> dict[str, float]:
    return learner.update(0, learner.prepare(exp)).metrics


def rank_main(rank, port, model_dir, lora_checkpoint, out_dir, results):
    from transformers import PreTrainedModel

    from relayrl.learner import sharded
    from relayrl.learner.process_group import all_reduce_sum, leave_learner_group, split_by_groups

    torch.set_num_threads(1)
    opened = count_safetensors_opens()
    if rank > 0:  # a rank other than 0 must build its models without reading the weights

        def refuse(cls, *args, **kwargs):
            raise AssertionError(f"learner rank {rank} read the weights of {cls.__name__}")

        PreTrainedModel.from_pretrained = classmethod(refuse)
    part = split_by_groups(gae_experience(), WORLD)[rank]
    learner = sharded.sharded_learner(
        learner_settings(config(model_dir, GAE)), rank, WORLD, "127.0.0.1", port, timeout_s=60
    )
    found = {"loaded": full_weights(learner), "tokens": all_reduce_sum(rank * float(part.loss_mask.sum()))}
    found["opened"] = [int(all_reduce_sum(float(len(opened)) if r == rank else 0.0)) for r in range(WORLD)]
    found["opened_files"] = sorted({Path(name).name for name in opened})
    found["local_share"] = local_shares(learner)
    stats = step(learner, part)
    found["loss"] = all_reduce_sum(stats["loss/policy"])  # each rank's loss is its part of the global sum
    found["critic"] = (stats["critic/value_loss"], stats["critic/grad_norm"], full_weights(learner)["critic"])
    found["mixed"] = mixed_precision_step(sharded, rank, port, model_dir, part, GAE)
    # the reference pass (adapter disabled) is the first forward: FSDP2 must still reduce the adapter's grads in fp32
    found["mixed_lora"] = mixed_precision_step(sharded, rank, port, model_dir, part, LORA)
    found["lora"] = lora_scenarios(sharded, rank, port, model_dir, lora_checkpoint, out_dir)
    if rank == 0:
        torch.save(found, f"{out_dir}/found.pt")
    leave_learner_group()
    results.put(rank)


def mixed_precision_step(sharded, rank, port, model_dir, part, extra) -> dict:
    """One step with FSDP2 all-gathering bf16 parameters (what sharded_init.mixed_precision gives a GPU run)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    gpu_policy, sharded.mixed_precision = (
        sharded.mixed_precision,
        lambda *_: MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    )
    learner = sharded.sharded_learner(
        learner_settings(config(model_dir, extra)), rank, WORLD, "127.0.0.1", port, timeout_s=60
    )
    sharded.mixed_precision = gpu_policy
    seen = []
    layer = sharded.transformer_blocks(learner.policy.model)[0]
    layer.register_forward_pre_hook(lambda module, _: seen.append(module.mlp.up_proj.weight.dtype))
    stats = step(learner, part)
    masters = {p.dtype for p in learner.policy.model.parameters()} | {
        v.dtype for s in learner.policy.optimizer.state.values() for v in s.values() if v.dim()
    }
    return {"pass_dtypes": set(seen), "master_dtypes": masters, "grad_norm": stats["actor/grad_norm"]}


def lora_scenarios(sharded, rank, port, model_dir, checkpoint, out_dir) -> dict:
    """1 -> 2: the W=1 LoRA checkpoint into two ranks; 2 -> 2: a sharded one written and read back. Each then
    takes the second step; the 2 -> 2 learner also writes the run's final model."""
    from relayrl.learner.process_group import split_by_groups

    def learner():
        return sharded.sharded_learner(
            learner_settings(config(model_dir, LORA)), rank, WORLD, "127.0.0.1", port, timeout_s=60
        )

    def resumed(path):
        loaded = learner()
        loaded.load_state(path, torch.load(f"{path}/trainer_state.pt", weights_only=False))
        return lora_step(loaded, split_by_groups(experience(seed=1), WORLD)[rank])

    found = {"1->2": resumed(checkpoint)}
    first = learner()
    found["loaded"] = {n: p.full_tensor().detach().clone() for n, p in first.policy.model.named_parameters()}
    lora_step(first, split_by_groups(experience(seed=0), WORLD)[rank])
    found["path"] = first.checkpoint(f"{out_dir}/lora_run", 0, {"version": 1}, keep=1)
    found["2->2"] = resumed(found["path"])
    return found


def lora_step(learner, part) -> tuple[float, dict, dict]:
    """(global loss, what sync.lora=merged sends, what sync.lora=adapter would send) after one step."""
    from relayrl.learner.process_group import all_reduce_sum

    loss = all_reduce_sum(learner.update(1, learner.prepare(part)).metrics["loss/total"])
    merged = dict(learner.named_weights())
    learner.policy.sync_mode = "adapter"
    adapter = dict(learner.named_weights())
    learner.policy.sync_mode = "merged"
    return loss, merged, adapter


def pushed(learner) -> tuple[dict, dict]:
    """A W=1 LoRA learner's merged and adapter pushes."""
    merged = {n: t.clone() for n, t in learner.named_weights()}
    learner.policy.sync_mode = "adapter"
    adapter = {n: t.clone() for n, t in learner.named_weights()}
    learner.policy.sync_mode = "merged"
    return merged, adapter


@pytest.fixture(scope="module")
def single_lora(random_model_dir, tmp_path_factory):
    """W=1 LoRA: a step, a checkpoint, and the uninterrupted second step (loss, merged and adapter pushes)."""
    from relayrl.learner.role import LearnerRole

    learner = LearnerRole(learner_settings(config(random_model_dir, LORA)))
    step(learner, experience(seed=0))
    path = learner.checkpoint(tmp_path_factory.mktemp("lora_single"), 0, {"version": 1}, keep=1)
    loss = learner.update(1, learner.prepare(experience(seed=1))).metrics["loss/total"]
    return path, loss, *pushed(learner)


@pytest.fixture(scope="module")
def found(random_model_dir, single_lora, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_init")
    args = (free_port(), str(random_model_dir), str(single_lora[0]), str(out_dir))
    run_ranks(rank_main, args, lambda done: len(done) >= WORLD)
    return torch.load(out_dir / "found.pt", weights_only=False)


@pytest.fixture(scope="module")
def single(random_model_dir):
    """The W=1 learner: its loaded weights, then one step on the whole batch."""
    from relayrl.learner.role import LearnerRole

    learner = LearnerRole(learner_settings(config(random_model_dir, GAE)))
    loaded = full_weights(learner)
    return loaded, step(learner, gae_experience()), full_weights(learner)["critic"]


def test_ranks_hold_the_single_learners_weights_without_loading_them(found, single):
    """Rank 1 could not read a weights file, yet every rank holds exactly W=1's policy, reference and critic
    (buffers such as the rotary inv_freq included), and the first step's loss is W=1's."""
    loaded, stats, _ = single
    for role, tensors in loaded.items():
        assert found["loaded"][role].keys() == tensors.keys(), role
        for name, tensor in tensors.items():
            assert torch.equal(found["loaded"][role][name], tensor), f"{role} {name}"
    assert found["loss"] == pytest.approx(stats["loss/policy"], abs=1e-6)


def test_only_rank_0_opens_the_weights_and_every_rank_keeps_only_its_shards(found, random_model_dir):
    """Counted at safetensors' `safe_open`, the one way transformers reads a checkpoint: rank 0 opened the model's
    weights file for its policy, reference and critic (read into CPU memory, sharded_init.load_on_host), rank 1
    never did; every model on rank 0 holds half of its elements once sharded (no whole copy left)."""
    weights = sorted(p.name for p in Path(random_model_dir).glob("*.safetensors"))
    rank0, rank1 = found["opened"]
    assert rank1 == 0 and rank0 >= 3 and found["opened_files"] == weights  # policy, reference, critic
    for role, share in found["local_share"].items():
        assert share == pytest.approx(0.5, abs=0.01), role


def test_lora_ranks_start_from_the_single_learners_weights(found, random_model_dir):
    """The base and the freshly initialised adapter, read and initialised on rank 0's host and broadcast, are W=1's
    bit for bit (the adapter's init draws from the seeded generator as at W=1)."""
    from relayrl.learner.role import LearnerRole

    single = LearnerRole(learner_settings(config(random_model_dir, LORA))).policy.model
    want = {n: p.detach() for n, p in single.named_parameters()}
    got = found["lora"]["loaded"]
    assert got.keys() == want.keys() and any(".lora_A." in n for n in want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_critic_update_does_not_depend_on_the_number_of_ranks(found, single):
    _, stats, critic = single
    assert found["tokens"] == 36.0  # rank 1's response tokens; rank 0 holds 30: a per-rank mean would differ
    loss, grad_norm, weights = found["critic"]
    assert loss == pytest.approx(stats["critic/value_loss"], rel=1e-5)
    assert grad_norm == pytest.approx(stats["critic/grad_norm"], rel=1e-5)
    for name, tensor in critic.items():
        assert torch.allclose(weights[name], tensor, atol=1e-5, rtol=0), name


def test_mixed_precision_passes_run_bf16_over_fp32_master_shards(found, single):
    mixed = found["mixed"]
    assert mixed["pass_dtypes"] == {torch.bfloat16}
    assert mixed["master_dtypes"] == {torch.float32}
    assert mixed["grad_norm"] == pytest.approx(single[1]["actor/grad_norm"], rel=0.05)  # W=1's, in bf16
    lora = found["mixed_lora"]
    assert (lora["pass_dtypes"], lora["master_dtypes"]) == ({torch.bfloat16}, {torch.float32})
    assert lora["grad_norm"] > 0


def test_mixed_precision_policy_is_gpu_only():
    from relayrl.config import load_config
    from relayrl.learner.sharded_init import mixed_precision

    gpu = mixed_precision(load_config(None, []).model, "cuda")
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision(load_config(None, ["model.dtype=bfloat16"]).model, "cuda").param_dtype == torch.bfloat16
    assert mixed_precision(load_config(None, ["model.dtype=float32"]).model, "cuda") is None
    assert mixed_precision(load_config(None, []).model, "cpu") is None


def assert_close(got: dict, want: dict, label: str) -> None:
    """Within 2e-4 (2% of one AdamW step at lr 1e-2): LoRA's A gradients start near 0 (B = 0), where a sum
    in another order can move one element's m / sqrt(v) by a few percent (measured: one element of a 256-element
    lora_A 2.2e-4 apart, deterministically on this machine), so one element in 200 of a tensor may be up to 2e-3
    (20% of a step) apart; a wrong normaliser or a lost gradient moves whole tensors by about the lr."""
    assert got.keys() == want.keys(), label
    for name, tensor in want.items():
        gap = (got[name] - tensor).abs()
        assert float(gap.max()) <= 2e-3 and int((gap > 2e-4).sum()) <= max(1, gap.numel() // 200), f"{label} {name}"


def test_lora_ranks_resume_train_and_push_like_one_learner(found, single_lora):
    _, loss, merged, adapter = single_lora
    assert any(".lora_A." in n for n in adapter) and not any(".lora_" in n for n in merged)
    for label in ("1->2", "2->2"):
        got_loss, got_merged, got_adapter = found["lora"][label]
        assert got_loss == pytest.approx(loss, rel=1e-5, abs=1e-7), label
        assert_close(got_merged, merged, f"{label} merged")
        assert_close(got_adapter, adapter, f"{label} adapter")


def test_lora_sharded_checkpoint_resumes_in_one_process_and_exports(random_model_dir, found, single_lora, tmp_path):
    """2 -> 1: the sharded LoRA checkpoint (adapter and optimizer, no base) into one plain LoRA learner; and
    its export is the base with the adapter merged in."""
    from relayrl.config import dump_config
    from relayrl.learner.dist_checkpoint import export_sharded
    from relayrl.learner.role import LearnerRole
    from relayrl.models.loading import load_causal_lm

    _, loss, merged, _ = single_lora
    path = found["lora"]["path"]
    learner = LearnerRole(learner_settings(config(random_model_dir, LORA)))
    learner.load_state(path, torch.load(f"{path}/trainer_state.pt", weights_only=False))
    assert learner.update(1, learner.prepare(experience(seed=1))).metrics["loss/total"] == pytest.approx(loss, rel=1e-5)
    assert_close(pushed(learner)[0], merged, "2->1 merged")
    run_dir = Path(path).parents[1]
    (run_dir / "config.yaml").write_text(dump_config(config(random_model_dir, LORA)))
    exported = load_causal_lm(export_sharded(path, tmp_path / "export", random_model_dir))
    first = LearnerRole(learner_settings(config(random_model_dir, LORA)))  # W=1 after the first step, merged
    step(first, experience(seed=0))
    assert_close({n: p.detach() for n, p in exported.named_parameters()}, pushed(first)[0], "export")
