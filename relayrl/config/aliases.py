"""Other frameworks' config names (TRL, verl, OpenRLHF) and the relayrl key each one means.

One table, used by the unknown-key message (`train.learning_rate` -> `train.lr`, TRL's name) and rendered
into docs/config.md. A name is the last part of the foreign key, or a dotted tail of it where the last part
alone is ambiguous (verl's `data.train_batch_size` counts prompts, OpenRLHF's `train_batch_size` samples).
docs/algorithms.md explains the semantics behind each pairing; `tests/unit/test_config_aliases.py` checks
the two agree. Left out: names that are already relayrl's (`seed`, `temperature`, `top_p`), which the
ordinary nearest-key search finds.
"""

from __future__ import annotations

from typing import NamedTuple


class ForeignName(NamedTuple):
    name: str  # the foreign key's last part, or a dotted tail of it
    key: str  # the relayrl key it corresponds to
    frameworks: str  # whose name it is
    note: str = ""  # where the meanings differ


FOREIGN_NAMES: tuple[ForeignName, ...] = tuple(
    ForeignName(*row)
    for row in (
        # sampling and batches
        ("num_generations", "rollout.n", "TRL"),
        ("n_samples_per_prompt", "rollout.n", "OpenRLHF"),
        ("generation_batch_size", "rollout.prompts_per_step", "TRL", "it counts completions: divide by rollout.n"),
        ("data.train_batch_size", "rollout.prompts_per_step", "verl"),
        ("rollout_batch_size", "rollout.prompts_per_step", "OpenRLHF"),
        ("train_batch_size", "train.mini_batch", "OpenRLHF"),
        ("ppo_mini_batch_size", "train.mini_batch", "verl", "it counts prompts; relayrl counts responses"),
        ("gradient_accumulation_steps", "train.mini_batch", "TRL", "relayrl takes the responses per optimizer step"),
        ("per_device_train_batch_size", "train.micro_batch", "TRL"),
        ("ppo_micro_batch_size_per_gpu", "train.micro_batch", "verl"),
        ("micro_train_batch_size", "train.micro_batch", "OpenRLHF"),
        ("use_dynamic_bsz", "train.micro_batch_tokens", "verl", "set the token budget instead of a switch"),
        ("ppo_max_token_len_per_gpu", "train.micro_batch_tokens", "verl", "relayrl's budget is per learner rank"),
        ("use_dynamic_batch", "train.micro_batch_tokens", "OpenRLHF", "set the token budget instead of a switch"),
        ("gradient_checkpointing", "learner.activation_checkpointing", "TRL, OpenRLHF, transformers"),
        ("lora_rank", "model.lora.rank", "verl, OpenRLHF"),
        ("lora_alpha", "model.lora.alpha", "verl, OpenRLHF, peft"),
        ("lora_dropout", "model.lora.dropout", "OpenRLHF, peft"),
        ("enable_gradient_checkpointing", "learner.activation_checkpointing", "verl"),
        ("num_iterations", "train.epochs", "TRL"),
        ("ppo_epochs", "train.epochs", "verl"),
        ("max_epochs", "train.epochs", "OpenRLHF"),
        ("max_steps", "train.steps", "TRL"),
        ("total_training_steps", "train.steps", "verl"),
        ("max_completion_length", "rollout.max_tokens", "TRL"),
        ("max_response_length", "rollout.max_tokens", "verl"),
        ("generate_max_len", "rollout.max_tokens", "OpenRLHF"),
        ("max_new_tokens", "rollout.max_tokens", "OpenRLHF, transformers"),
        ("max_prompt_length", "data.max_prompt_tokens", "TRL, verl"),
        ("prompt_max_len", "data.max_prompt_tokens", "OpenRLHF"),
        ("use_vllm", "rollout.engine", "TRL"),
        # optimizer
        ("learning_rate", "train.lr", "TRL"),
        ("actor_learning_rate", "train.lr", "OpenRLHF"),
        ("lr_warmup_steps", "train.warmup_steps", "verl"),
        ("lr_warmup_ratio", "train.warmup_steps", "OpenRLHF", "a ratio; relayrl counts steps"),
        ("lr_scheduler_type", "train.lr_schedule", "TRL, verl"),
        ("lr_scheduler", "train.lr_schedule", "OpenRLHF"),
        ("max_grad_norm", "train.grad_clip", "TRL"),
        ("max_norm", "train.grad_clip", "OpenRLHF"),
        ("l2", "train.weight_decay", "OpenRLHF"),
        ("adam_betas", "train.betas", "OpenRLHF"),
        ("adam_beta1", "train.betas", "TRL"),
        ("adam_beta2", "train.betas", "TRL"),
        # advantage
        ("adv_estimator", "algorithm.advantage", "verl"),
        ("advantage_estimator", "algorithm.advantage", "OpenRLHF"),
        ("scale_rewards", "algorithm.advantage", "TRL", '"none" is dr_grpo, i.e. algorithm.std_normalize=false'),
        ("norm_adv_by_std_in_grpo", "algorithm.std_normalize", "verl"),
        ("lambd", "algorithm.lam", "OpenRLHF"),
        # policy loss
        ("loss_mode", "algorithm.policy_loss", "verl"),
        ("policy_loss_type", "algorithm.policy_loss", "OpenRLHF"),
        ("importance_sampling_level", "algorithm.policy_loss", "TRL"),
        ("epsilon", "algorithm.clip_eps", "TRL"),
        ("clip_ratio", "algorithm.clip_eps", "verl"),
        ("eps_clip", "algorithm.clip_eps", "OpenRLHF"),
        ("clip_ratio_low", "algorithm.clip_eps_low", "verl"),
        ("clip_ratio_high", "algorithm.clip_eps_high", "verl"),
        ("epsilon_high", "algorithm.clip_eps_high", "TRL"),
        ("eps_clip_low_high", "algorithm.clip_eps_low", "OpenRLHF", "LOW HIGH: also algorithm.clip_eps_high"),
        ("clip_ratio_c", "algorithm.dual_clip_c", "verl"),
        ("dual_clip", "algorithm.dual_clip_c", "OpenRLHF"),
        ("delta", "algorithm.dual_clip_c", "TRL", "the closest counterpart"),
        ("loss_agg_mode", "algorithm.loss_agg", "verl"),
        ("loss_type", "algorithm.loss_agg", "TRL"),
        ("entropy_coeff", "algorithm.entropy_coef", "verl"),
        ("entropy_loss_coef", "algorithm.entropy_coef", "OpenRLHF"),
        # KL
        ("beta", "algorithm.kl.coef", "TRL"),
        ("kl_loss_coef", "algorithm.kl.coef", "verl"),
        ("kl_coef", "algorithm.kl.coef", "verl"),
        ("init_kl_coef", "algorithm.kl.coef", "OpenRLHF"),
        ("use_kl_loss", "algorithm.kl.placement", "verl, OpenRLHF"),
        ("use_kl_in_reward", "algorithm.kl.placement", "verl"),
        ("kl_loss_type", "algorithm.kl.estimator", "verl"),
        ("kl_penalty", "algorithm.kl.estimator", "verl"),
        ("kl_estimator", "algorithm.kl.estimator", "OpenRLHF"),
        ("kl_ctrl.type", "algorithm.kl.controller", "verl"),
        ("target_kl", "algorithm.kl.target", "verl"),
        ("kl_target", "algorithm.kl.target", "OpenRLHF"),
        ("kl_horizon", "algorithm.kl.horizon", "OpenRLHF"),
        # rollout correction and DAPO
        ("rollout_is", "algorithm.correction.mode", "verl"),
        ("rollout_rs", "algorithm.correction.mode", "verl"),
        ("vllm_importance_sampling_mode", "algorithm.correction.mode", "TRL"),
        ("vllm_is_correction_type", "algorithm.correction.mode", "OpenRLHF"),
        ("rollout_is_threshold", "algorithm.correction.threshold", "verl"),
        ("tis_imp_ratio_cap", "algorithm.correction.threshold", "verl"),
        ("vllm_importance_sampling_cap", "algorithm.correction.threshold", "TRL"),
        ("filter_groups", "algorithm.dapo.dynamic_sampling", "verl"),
        ("dynamic_filtering", "algorithm.dapo.dynamic_sampling", "OpenRLHF"),
        ("max_num_gen_batches", "algorithm.dapo.max_rounds", "verl"),
        ("overlong_buffer_len", "algorithm.dapo.overlong_buffer", "OpenRLHF"),
        ("mask_truncated_completions", "algorithm.dapo.overlong_filter", "TRL", "it drops truncated responses"),
        # model, data, critic, outputs
        ("model_name_or_path", "model.path", "TRL"),
        ("pretrain", "model.path", "OpenRLHF"),
        ("critic_pretrain", "critic.path", "OpenRLHF"),
        ("critic_learning_rate", "critic.lr", "OpenRLHF"),
        ("prompt_data", "data.train", "OpenRLHF"),
        ("train_files", "data.train", "verl"),
        ("val_files", "data.eval", "verl"),
        ("reward_funcs", "reward.fn", "TRL"),
        ("reward_weights", "reward.components", "TRL", "each component has a weight"),
        ("output_dir", "log.dir", "TRL"),
        ("default_local_dir", "log.dir", "verl"),
        ("save_path", "log.dir", "OpenRLHF"),
        ("report_to", "log.backends", "TRL"),
        ("save_steps", "checkpoint.every", "TRL, OpenRLHF"),
        ("save_freq", "checkpoint.every", "verl"),
        ("save_total_limit", "checkpoint.keep", "TRL"),
        ("eval_steps", "eval.every", "TRL, OpenRLHF"),
        ("test_freq", "eval.every", "verl"),
        ("vllm_num_engines", "placement.engines", "OpenRLHF"),
        ("vllm_tensor_parallel_size", "rollout.tensor_parallel", "TRL, OpenRLHF"),
        ("tensor_model_parallel_size", "rollout.tensor_parallel", "verl"),
        ("colocate_all_models", "placement.layout", "OpenRLHF"),
    )
)


def foreign_name(path: str) -> ForeignName | None:
    """The entry for an unknown dotted key whose tail is another framework's name (the longest tail wins)."""
    parts = path.split(".")
    by_name = {entry.name: entry for entry in FOREIGN_NAMES}
    for start in range(len(parts)):
        if entry := by_name.get(".".join(parts[start:])):
            return entry
    return None
