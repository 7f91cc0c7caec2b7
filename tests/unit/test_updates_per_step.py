"""The number of optimizer steps per training step is written once, as a Config property, and read by the
learner (its LR schedule length), the controller (staleness in optimizer steps) and the planner."""


def test_updates_per_step_is_one_config_property_the_learner_and_planner_use():
    from relayrl.config import load_config
    from relayrl.planner.estimate import workload_from_config

    config = load_config(None, ["rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch=8", "train.epochs=3"])
    assert config.updates_per_step == 6  # 16 / 8 mini-batches x 3 epochs
    assert workload_from_config(config).optimizer_steps == 6
