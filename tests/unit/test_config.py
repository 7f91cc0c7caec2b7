"""relayrl.config: YAML + dotted overrides -> a strictly validated Config, and every way a user gets it wrong."""

from __future__ import annotations

import warnings

import pytest
from pydantic import BaseModel

from relayrl.build import resolve
from relayrl.config import Config, dump_config, load_config, parse_override
from relayrl.errors import ConfigError, RelayError


def write(tmp_path, text: str, name: str = "config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    assert isinstance(info.value, RelayError)
    return str(info.value)


# ---------------------------------------------------------------------------- what works


def test_defaults_validate_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config()
    assert config == Config() and config.rollout.engine == "auto"  # validated: the choices are the builder's
    assert resolve(config) == resolve(Config())
    assert config.rollout.n == 8 and config.train.lr == 1e-5 and config.data.eval is None
    assert config.mini_batch == config.rollout_batch == 16 * 8


def test_yaml_file_and_overrides_take_effect_overrides_win(tmp_path):
    path = write(tmp_path, "train:\n  steps: 7\n  lr: 3.0e-4\nrollout:\n  n: 4\ndata:\n  eval: held.jsonl\n")
    config = load_config(path, ["train.lr=1e-5", 'rollout.stop=["\\n", "###"]', "data.eval=null"])
    assert config.train.steps == 7  # from the file
    assert config.rollout.n == 4  # from the file
    assert config.train.lr == 1e-5  # the override beats the file
    assert config.rollout.stop == ["\n", "###"]  # a YAML list, with a YAML escape
    assert config.data.eval is None  # YAML null
    assert config.rollout.temperature == 1.0  # untouched keys keep their defaults


def test_nested_section_override():
    config = load_config(None, ["algorithm.kl.coef=0.05", "train.betas=[0.8, 0.9]"])
    assert config.algorithm.kl.coef == 0.05
    assert config.train.betas == (0.8, 0.9)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.lr=1e-5", 1e-5),  # YAML 1.1 would read this as the string '1e-5'
        ("train.lr=3.0e-4", 3e-4),
        ("rollout.n=4", 4),
        ("data.shuffle=false", False),
        ("data.eval=null", None),
        ("rollout.stop=[a, b]", ["a", "b"]),
        ("reward.kwargs={pattern: x, scale: 1e-3}", {"pattern": "x", "scale": 1e-3}),
        ("model.path=", ""),
        ("model.path=a=b", "a=b"),  # only the first '=' separates key from value
    ],
)
def test_override_values_are_parsed_as_yaml(override, expected):
    key, value = parse_override(override)
    assert key == override.partition("=")[0]
    assert value == expected and type(value) is type(expected)


def test_scientific_notation_reaches_untyped_kwargs_as_a_float():
    config = load_config(None, ["reward.kwargs.scale=1e-3"])
    assert config.reward.kwargs == {"scale": 1e-3}


def test_yaml_file_scientific_notation_without_dot(tmp_path):
    config = load_config(write(tmp_path, "reward:\n  kwargs:\n    eps: 1e-6\n"))
    assert config.reward.kwargs["eps"] == 1e-6


def test_base_is_used_and_not_mutated_by_overrides():
    base = {"train": {"steps": 3}, "rollout": {"n": 4}}
    config = load_config(None, ["train.steps=5", "rollout.temperature=0.5"], base=base)
    assert (config.train.steps, config.rollout.n, config.rollout.temperature) == (5, 4, 0.5)
    assert base == {"train": {"steps": 3}, "rollout": {"n": 4}}


def test_file_merges_over_base(tmp_path):
    path = write(tmp_path, "train:\n  lr: 2.0e-5\n")
    config = load_config(path, base={"train": {"steps": 3, "lr": 1.0}})
    assert config.train.steps == 3 and config.train.lr == 2e-5


# ---------------------------------------------------------------------------- unknown keys


def test_unknown_key_in_override_suggests_same_section():
    message = config_error(None, ["train.lrr=1e-5"])
    assert "'train.lrr'" in message
    assert "did you mean 'train.lr'?" in message


def test_unknown_key_in_yaml_suggests_same_section(tmp_path):
    message = config_error(write(tmp_path, "train:\n  stpes: 3\n"))
    assert "'train.stpes'" in message
    assert "did you mean 'train.steps'?" in message


def test_key_from_another_section_suggests_its_real_place():
    message = config_error(None, ["train.temperature=0.7"])
    assert "'train.temperature'" in message
    assert "did you mean 'rollout.temperature'?" in message


def test_key_from_another_section_in_yaml(tmp_path):
    message = config_error(write(tmp_path, "rollout:\n  lr: 0.1\n"))
    assert "'rollout.lr'" in message and "did you mean 'train.lr'?" in message


def test_unknown_key_in_nested_section_has_full_path():
    message = config_error(None, ["algorithm.kl.estimatr=k3"])
    assert "'algorithm.kl.estimatr'" in message
    assert "did you mean 'algorithm.kl.estimator'?" in message


def test_unknown_key_in_an_optional_section_is_named_with_its_nearest_key(tmp_path):
    """`model.lora` is `LoraConfig | None`: a typo inside it gets the same message as in any section."""
    message = config_error(None, ["model.lora.rnak=4"])
    assert "unknown config key 'model.lora.rnak'" in message and "did you mean 'model.lora.rank'?" in message
    message = config_error(write(tmp_path, "model:\n  lora:\n    rank: 4\n    alhpa: 8\n"))
    assert "'model.lora.alhpa'" in message and "did you mean 'model.lora.alpha'?" in message


def test_unknown_top_level_section():
    message = config_error(None, ["trian.lr=1e-5"])
    assert "'trian'" in message and "did you mean 'train'?" in message


def test_unknown_top_level_section_far_from_anything_lists_known(tmp_path):
    message = config_error(write(tmp_path, "zzzzzz:\n  q: 1\n"))
    assert "'zzzzzz'" in message
    for section in Config.model_fields:
        assert section in message


# ---------------------------------------------------------------------------- wrong values


def test_type_error_names_the_key_and_value():
    message = config_error(None, ["train.steps=abc"])
    assert "train.steps" in message and "'abc'" in message
    assert "overrides" in message  # where the bad value came from


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "learner.activation_checkpointing=maybe",
            "learner.activation_checkpointing: should be a boolean (true/false) or 'auto' (got 'maybe')",
        ),
        (
            "rollout.gpu_memory_utilization=most",
            "rollout.gpu_memory_utilization: should be a number or 'auto' (got 'most')",
        ),
    ],
)
def test_a_value_no_member_of_a_union_takes_is_one_line_naming_what_each_takes(override, line):
    """`bool | Literal["auto"]`: pydantic reports one error per member; the key gets one line."""
    message = config_error(None, [override])
    assert message.splitlines()[1:] == [f"  {line}"], message


def test_type_error_in_file_names_the_file(tmp_path):
    path = write(tmp_path, "rollout:\n  temperature: hot\n")
    message = config_error(path)
    assert "rollout.temperature" in message and str(path) in message


def test_range_error_names_the_key():
    message = config_error(None, ["rollout.n=0"])
    assert "rollout.n" in message and "greater than or equal to 1" in message


def test_negative_seed_is_rejected_at_config_time():
    # numpy's default_rng (the prompt sampler) rejects negative seeds; fail here, naming the key
    assert "train.seed" in config_error(None, ["train.seed=-1"])


def test_literal_violation_lists_allowed_values():
    message = config_error(None, ["rollout.engine=sglang"])
    assert "rollout.engine" in message and "'sglang'" in message
    assert "'vllm'" in message and "'hf'" in message


def test_mini_batch_must_divide_rollout_batch():
    message = config_error(None, ["rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch=5"])
    assert "train.mini_batch=5" in message and "16" in message
    assert "{'rollout'" not in message  # the whole input tree is not dumped into the message


def test_mini_batch_that_divides_is_accepted():
    config = load_config(None, ["rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch=8"])
    assert config.mini_batch == 8 and config.rollout_batch == 16


def test_grpo_needs_a_group_of_two():
    message = config_error(None, ["rollout.n=1"])
    assert "rollout.n" in message and "grpo" in message


def test_section_given_a_scalar_in_override():
    message = config_error(None, ["train=3"])
    assert "'train' is a section" in message and "train.steps=" in message


def test_section_given_a_scalar_in_yaml(tmp_path):
    message = config_error(write(tmp_path, "rollout: fast\n"))
    assert "'rollout' is a section" in message


def test_nested_section_given_a_scalar():
    assert "'algorithm.kl' is a section" in config_error(None, ["algorithm.kl=0.1"])


def test_override_into_a_value_fails():
    message = config_error(None, ["train.lr.max=1"], base={"train": {"lr": 0.1}})
    assert "train.lr" in message and "not a section" in message


@pytest.mark.parametrize("override", ["train.lr", "=3", "  =3"])
def test_override_without_key_value_form_fails(override):
    message = config_error(None, [override])
    assert repr(override) in message and "section.key=value" in message


def test_missing_config_file_names_it(tmp_path):
    path = tmp_path / "nope.yaml"
    message = config_error(path)
    assert str(path) in message and "not found" in message


def test_invalid_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "train:\n  steps: [1, 2\n")
    message = config_error(path)
    assert str(path) in message and "not valid YAML" in message


def test_yaml_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- train\n- rollout\n")
    message = config_error(path)
    assert str(path) in message and "mapping" in message


def test_empty_yaml_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "# nothing\n")) == Config()


# ---------------------------------------------------------------------------- dump, warnings, docs


def test_dump_round_trips(tmp_path):
    config = resolve(
        load_config(
            None,
            [
                "train.lr=3e-4",
                'rollout.stop=["\\n"]',
                "data.eval=held.jsonl",
                "algorithm.kl.coef=0.1",
                "reward.kwargs={pattern: '\\d+'}",
                "train.mini_batch=32",
                "rollout.engine=hf",
                "train.betas=[0.8, 0.95]",
            ],
        )
    )
    path = write(tmp_path, dump_config(config), "dumped.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a full dump sets every key, so the "no effect" warnings fire
        reloaded = resolve(load_config(path))
    assert reloaded == config
    assert reloaded.model_dump() == config.model_dump()
    assert dump_config(reloaded) == dump_config(config)


def test_default_dump_round_trips(tmp_path):
    path = write(tmp_path, dump_config(Config()), "dumped.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a full dump sets algorithm.kl.estimator explicitly, with coef 0
        assert load_config(path) == Config()


def test_estimator_without_kl_warns_naming_the_key():
    with pytest.warns(UserWarning, match=r"algorithm\.kl\.estimator.*algorithm\.kl\.coef"):
        load_config(None, ["algorithm.kl.estimator=k3"])


def test_estimator_with_kl_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, ["algorithm.kl.estimator=k3", "algorithm.kl.coef=0.1"])


def test_kv_cache_with_hf_engine_warns():
    with pytest.warns(UserWarning, match=r"rollout\.kv_cache_gib"):
        load_config(None, ["rollout.engine=hf", "rollout.kv_cache_gib=2"])


def test_warning_points_at_the_caller():
    with pytest.warns(UserWarning) as record:
        load_config(None, ["algorithm.kl.estimator=k3"])
    assert record[0].filename == __file__


def _fields(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from _fields(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def test_every_field_has_a_description():
    fields = dict(_fields(Config))
    assert len(fields) > 40 and "algorithm.kl.coef" in fields  # the walk reaches nested sections
    missing = [path for path, field in fields.items() if not (field.description or "").strip()]
    assert not missing, f"fields without a description (the docs are generated from them): {missing}"


def test_kl_settings_without_a_coefficient_warn():
    with pytest.warns(UserWarning, match="algorithm.kl.placement has no effect"):
        load_config(None, ["algorithm.kl.placement=reward"])


def test_correction_settings_without_a_mode_warn():
    with pytest.warns(UserWarning, match="algorithm.correction settings have no effect"):
        load_config(None, ["algorithm.correction.threshold=3"])


def test_adaptive_kl_needs_an_initial_coefficient():
    with pytest.raises(ConfigError, match="adaptive needs an initial algorithm.kl.coef"):
        load_config(None, ["algorithm.kl.controller=adaptive"])


def test_eval_settings_without_eval_data_warn():
    with pytest.warns(UserWarning, match="eval.every has no effect without data.eval"):
        load_config(None, ["eval.every=5"])


def test_overlapped_schedules_need_ray_and_warn_about_what_they_change():
    with pytest.raises(ConfigError, match="needs separate processes: set placement.mode=ray"):
        load_config(overrides=["train.schedule=async"])
    with pytest.raises(ConfigError, match="partial_rollouts needs train.schedule=async with train.on_stale=drop"):
        load_config(overrides=["placement.mode=ray", "train.schedule=async", "train.partial_rollouts=1.5"])
    with pytest.warns(UserWarning) as caught:
        load_config(overrides=["placement.mode=ray", "train.schedule=one_step_off", "checkpoint.every=2"])
    messages = " ".join(str(w.message) for w in caught)
    assert "lose no prompt" in messages and "not a replay" in messages and "without correction" in messages
    with pytest.warns(UserWarning, match="train.max_staleness has no effect under train.schedule=sync"):
        load_config(overrides=["train.max_staleness=3"])


def test_transport_and_placement_must_agree():
    with pytest.raises(ConfigError, match="sync.transport=shm needs placement.mode=ray"):
        load_config(overrides=["sync.transport=shm"])
    with pytest.raises(ConfigError, match="sync.transport=inprocess needs placement.mode=local"):
        load_config(overrides=["placement.mode=ray", "sync.transport=inprocess"])
    with pytest.raises(ConfigError, match="placement.mode=ray runs vLLM engines"):
        load_config(overrides=["placement.mode=ray", "rollout.engine=hf"])
    with pytest.warns(UserWarning, match="placement.engines has no effect under placement.mode=local"):
        load_config(overrides=["placement.engines=2"])


def test_min_tokens_cannot_exceed_max_tokens():
    with pytest.raises(ConfigError, match="rollout.min_tokens=9 exceeds rollout.max_tokens=8"):
        load_config(None, ["rollout.min_tokens=9", "rollout.max_tokens=8"])
    assert load_config(None, ["rollout.min_tokens=8", "rollout.max_tokens=8"]).rollout.min_tokens == 8


def test_packing_takes_only_its_layouts():
    assert load_config(None, []).train.packing == "auto"
    with pytest.raises(ConfigError, match="train.packing"):
        load_config(None, ["train.packing=rows"])


def test_a_bare_on_or_off_is_the_word_not_yaml_s_boolean(tmp_path):
    """YAML 1.1 reads `off` as false: keys whose values are the words on/off take them back as words."""
    path = write(tmp_path, "rollout:\n  prefix_caching: off\n  enforce_eager: on\n  sleep: off\n")
    rollout = load_config(path).rollout
    assert (rollout.prefix_caching, rollout.enforce_eager, rollout.sleep) == ("off", "on", "off")
    assert load_config(None, ["rollout.prefix_caching=off"]).rollout.prefix_caching == "off"
