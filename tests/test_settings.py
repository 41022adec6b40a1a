"""Settings are parsed once: a config becomes frozen, typed dataclasses (config/settings.py),
every key checked with a one-line error, defaults for keys a config leaves out."""

import dataclasses
import importlib
import json
import pkgutil
import types

import jax
import pytest
from ml_collections import ConfigDict

from jaxillusions import configs, tasks
from jaxillusions.config import fields, settings
from jaxillusions.pipeline import validate
from jaxillusions.runtime import machine
from jaxillusions.training import train

NAMES = sorted(info.name for info in pkgutil.iter_modules(configs.__path__))


def _config(name: str) -> ConfigDict:
    module = importlib.import_module(f"jaxillusions.configs.{name}")
    try:
        return module.get_config()
    except TypeError:  # a config that takes an argument (its variants)
        return module.get_config(next(iter(module.VARIANTS)))


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_config_becomes_frozen_typed_settings(name):
    config = _config(name)
    run = validate.parse(config)
    assert isinstance(run.data, tasks.get(run.task).Data)
    flat = settings.flat(run)
    for section in ("data", *settings.SECTIONS, *type(run).STUDIES):
        converts = {f.name: fields.rule(f).convert  # (paths made absolute)
                    for f in dataclasses.fields(getattr(run, section))}
        for key, value in config[section].items():  # every key of the config, as typed
            want = tuple(value) if isinstance(value, list | tuple) else value
            if isinstance(value, ConfigDict):  # a mapping-valued key (text: data.files)
                want = value.to_dict()
            want = converts[key](want) if converts[key] else want
            assert flat[f"{section}.{key}"] == want, key
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train.num_steps = 1
    # Written to config.json and read back (lists become tuples again): the same settings.
    assert validate.parse(run.to_dict()) == run


def test_a_missing_key_takes_its_default_and_lists_become_tuples():
    run = validate.parse({"task": "dyck", "train": {"num_steps": 7},
                                "proxies": {"svd_ranks": [1, 2]}})
    assert run.train.num_steps == 7 and run.train.batch_size == settings.Train().batch_size
    assert run.proxies.svd_ranks == (1, 2) and run.data == tasks.get("dyck").Data()
    assert validate.parse(run) is run  # Settings pass through unchanged


@pytest.mark.parametrize("change, message", [
    ({"train": {"num_step": 5}}, "unknown config key train.num_step; allowed in train: "),
    ({"trian": {}}, "unknown config key trian; allowed in the top level: "),
    ({"train": {"num_steps": 2.5}}, "train.num_steps=2.5: must be an integer, >= 1"),
    ({"train": {"num_steps": 0}}, "train.num_steps=0: must be >= 1"),
    ({"model": {"pos_encoding": "rope"}}, "model.pos_encoding='rope': must be one of none"),
    ({"data": {"min_len": 30}}, "data.min_len=30: must be in [2, data.max_len]"),
    ({"model": {"uniform_attention_layers": (2,)}},
     "model.uniform_attention_layers=(2,): must be layer indices in [0, model.n_layers)"),
    ({"task": "nope"}, "task='nope': must be one of dyck, code"),
    ({"figures": "every"}, "figures='every': must be one of summary, all, none"),
    # JAX would hang starting 10**15 devices: refused before it starts.
    ({"cpu_devices": 10**15}, "cpu_devices=1000000000000000: must be 0 to 1024"),
    # The members' seeds are 32-bit: past them a seed would train another seed's models (or
    # overflow int64 in the prediction stage's check, as a traceback).
    ({"seed": 2**63}, "seed=9223372036854775808: must be >= 0, with seed + train.num_seeds at "
     "most 4294967296"),
    ({"seed": 2**32 - 3, "train": {"num_seeds": 4}}, "seed=4294967293: must be >= 0, with seed"),
    # A value given twice in a tuple: it had trained, fitted and evaluated, then failed in the
    # reports ("the rows hold several groups of members"), or counted the rows twice.
    ({"proxies": {"circuit_ablation": ("mean", "mean")}}, "proxies.circuit_ablation=('mean', "
     "'mean'): 'mean' is given twice; give each value once"),
    ({"proxies": {"svd_targets": ("blocks.0.resid_mid",) * 2}}, "proxies.svd_targets=("),
    ({"proxies": {"eval_splits": ("iid", "longer", "longer")}}, "proxies.eval_splits=('iid', "
     "'longer', 'longer'): 'longer' is given twice"),
    ({"proxies": {"svd_ranks": (1, 2, 2)}}, "proxies.svd_ranks=(1, 2, 2): 2 is given twice"),
    ({"model": {"pretrained": ("/a", "/a")}}, "model.pretrained=('/a', '/a'): '/a' is given"),
])
def test_a_bad_key_is_a_one_line_error_naming_it(change, message):
    with pytest.raises(ValueError) as err:
        validate.parse(change)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_last_seeds_of_32_bits_are_accepted():
    run = validate.parse({"seed": 2**32 - 4, "train": {"num_seeds": 4}})
    assert list(train.seed_list(run)) == [2**32 - 4, 2**32 - 3, 2**32 - 2, 2**32 - 1]


def test_the_code_task_has_its_own_data_settings():
    run = validate.parse({"task": "code", "data": {"context": 64}})
    assert run.data.context == 64 and not hasattr(run.data, "num_types")
    with pytest.raises(ValueError, match="unknown config key data.num_types"):
        validate.parse({"task": "code", "data": {"num_types": 3}})


def test_check_gives_settings_and_the_cross_checks_need_the_model():
    config = _config("dyck_small")
    config.cpu_devices = 0  # the test process's devices (conftest.jax_started)
    run, notes = validate.check(config)
    assert isinstance(run, settings.Settings) and notes == []
    config.proxies.targets = ("blocks.5.attn.k",)  # the demo model has 2 layers
    with pytest.raises(ValueError, match="proxies.targets: "):
        validate.check(config)


REFUSED = [("jax_enable_x64", True), ("jax_numpy_dtype_promotion", "strict"),
           ("jax_numpy_rank_promotion", "raise"), ("jax_default_prng_impl", "rbg"),
           ("jax_threefry_partitionable", False)]


@pytest.mark.parametrize("name, value", REFUSED)
def test_a_jax_setting_the_code_is_not_written_for_is_refused_at_the_door(name, value):
    # Was: under 64-bit defaults the Quickstart's job failed in k-means' fit after training,
    # under strict dtype promotion or rank promotion that raises at the first training step;
    # the rbg generator and threefry's other mode trained other models from the same seeds.
    config = _config("dyck_small")
    config.cpu_devices = 0  # the test process's devices (conftest.jax_started)
    before = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        with pytest.raises(ValueError) as err:
            validate.check(config)
    finally:
        jax.config.update(name, getattr(before, "value", before))
    message = str(err.value)
    assert message.startswith(f"{name.upper()}={value} (JAX's {name}): ") and "\n" not in message
    assert message.endswith(f"unset {name.upper()}, or call jax.config.update({name!r}, "
                            f"{machine.REQUIRED_JAX_CONFIG[name][0][0]!r}) before the run")
    validate.check(config)  # restored: accepted


def test_every_required_jax_setting_is_tried_and_a_warning_mode_is_accepted():
    assert {name for name, _ in REFUSED} == set(machine.REQUIRED_JAX_CONFIG)
    jax.config.update("jax_numpy_rank_promotion", "warn")
    try:
        machine.check_jax_config()
    finally:
        jax.config.update("jax_numpy_rank_promotion", "allow")


def test_a_new_proxy_files_sizes_key_gets_a_field(monkeypatch):
    from jaxillusions import proxies

    module = types.ModuleType("jaxillusions.proxies.scaled")  # a file that names no settings
    module.STATISTIC, module.SITE = "moments", "vector"
    monkeypatch.setattr(proxies, "available", lambda: ("svd", "scaled"))
    monkeypatch.setattr(proxies, "get", lambda name: module if name == "scaled"
                        else importlib.import_module(f"jaxillusions.proxies.{name}"))
    run = validate.parse({"proxies": {"scaled_sizes": (5, 10)}})
    assert run.proxies.scaled_sizes == (5, 10)
    with pytest.raises(ValueError, match=r"proxies.scaled_sizes=\(0,\): must be scaled"):
        validate.parse({"proxies": {"scaled_sizes": (0,)}})


def test_a_proxy_file_owns_its_options(monkeypatch):
    # A proxy declares its own keys in its file (OPTIONS): config.proxies gains them, with
    # their rules and defaults, and nothing else names them.
    from jaxillusions import proxies
    from jaxillusions.config import fields

    module = types.ModuleType("jaxillusions.proxies.scaled")
    module.STATISTIC, module.SITE = "moments", "vector"
    module.OPTIONS = {"scaled_gain": fields.setting(2.0, fields.NUMBER, "> 0",
                                                    lambda v, s: v > 0, "the scale's gain")}
    monkeypatch.setattr(proxies, "available", lambda: ("svd", "scaled"))
    monkeypatch.setattr(proxies, "get", lambda name: module if name == "scaled"
                        else importlib.import_module(f"jaxillusions.proxies.{name}"))
    settings._proxies_class.cache_clear()  # noqa: SLF001 - the class of these proxy files
    assert validate.parse({}).proxies.scaled_gain == 2.0
    assert validate.parse({"proxies": {"scaled_gain": 0.5}}).proxies.scaled_gain == 0.5
    with pytest.raises(ValueError, match=r"^proxies.scaled_gain=-1.0: must be > 0$"):
        validate.parse({"proxies": {"scaled_gain": -1.0}})
    assert "`proxies.scaled_gain`" in validate.reference()
    settings._proxies_class.cache_clear()  # noqa: SLF001


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize("name", NAMES)
def test_the_launchers_add_every_key_a_config_leaves_out_and_change_no_setting(name):
    from jaxillusions.launch import common

    config = _config(name)
    completed = common.with_defaults(_config(name))
    run = validate.parse(config)
    for key in settings.flat(validate.parse({"task": run.task})):
        section, _, field = key.rpartition(".")
        assert field in (completed[section] if section else completed), key  # overridable
    # The same settings (so the same numbers, config.json and stage stamps) as the file's own.
    assert validate.parse(completed) == run
    assert validate.parse(completed).to_dict() == run.to_dict()


def _command_line(*overrides: str):
    """The launchers' --config flag parsed from `overrides` on the dyck_small config (a flag set
    of its own, not the process's), as `jaxillusions sweep` reads it; cpu_devices 0: the test
    process's devices (conftest.jax_started)."""
    from absl import flags

    from jaxillusions.launch import common

    argv = ["jaxillusions.launch.sweep", "--config=dyck_small", "--config.cpu_devices=0",
            *overrides]
    values = flags.FlagValues()
    holder = common.define_config_flag(values, argv)
    values(argv)
    return holder.value


def test_the_dictionary_keys_can_be_overridden_on_the_demo_config():
    # Was: --config.proxies.sae_targets=... "unknown config key", because the dyck_small config
    # does not name the dictionary keys.
    config = _command_line('--config.proxies.methods=("svd","sae","transcoder")',
                           '--config.proxies.sae_targets=("blocks.-1.attn.k","blocks.0.resid_mid")',
                           "--config.proxies.transcoder_sizes=(32,64)",
                           '--config.proxies.transcoder_targets=("blocks.-1.mlp.out",)',
                           "--config.proxies.sae_k=(4,8)", "--config.wen.enabled=False",
                           "--config.train.num_steps=10")
    run, notes = validate.check(config)
    assert notes == []
    assert run.proxies.methods == ("svd", "sae", "transcoder")
    assert run.proxies.sae_targets == ("blocks.-1.attn.k", "blocks.0.resid_mid")
    assert run.proxies.transcoder_sizes == (32, 64) and run.proxies.sae_k == (4, 8)
    assert run.train.num_steps == 10 and run.train.batch_size == 32  # the file's own keys
    assert config.is_locked  # an unknown key is still refused
    # The methods alone: the transcoder has no default sizes, and the error says how to set them.
    config = _command_line('--config.proxies.methods=("svd","sae","transcoder")')
    with pytest.raises(ValueError, match=r"^proxy 'transcoder' needs config\.proxies\."
                                         r"transcoder_sizes .*--config\.proxies\.transcoder_"
                                         r"sizes='\(32,64\)'$"):
        validate.check(config)


# ----------------------------------------------------------------------------- renamed keys


def test_every_renamed_key_is_read_under_its_new_name_with_one_note():
    # Each old name of settings.RENAMED, set to a value that is not its default, lands on the
    # new key; the old name is no field any more (so no key is read twice), and the note says
    # both names.
    run = validate.parse({})
    for old, new in settings.RENAMED.items():
        section, _, name = new.partition(".")
        value = {"geometry.enabled": True, "geometry.repair_sentences": (4, 16),
                 "probes.sites": ("blocks.0.resid_post",), "probes.ridge": 0.5,
                 "fit_shift.splits": ("train", "longer"), "fit_shift.sentences": 7,
                 "dictionaries.match_seeds": 3}[new]
        assert settings.flat(run)[new] != value  # not the default: the move is visible
        config = {"proxies": {old.partition(".")[2]: list(value) if isinstance(value, tuple)
                              else value}}
        assert settings.flat(validate.parse(config))[new] == value, old
        assert settings.renamed(config) == [
            f"note: {old} is now {new}; the old name goes in the next release"]
        assert old not in settings.flat(run) and not settings.renamed({section: {name: value}})
    assert not settings.renamed(run)  # Settings hold only the new names


@pytest.mark.parametrize("old, new, value, other", [
    ("geometry", "enabled", False, True), ("fit_splits", "splits", ("train", "iid"),
                                           ("train", "longer")),
    ("probe_ridge", "ridge", 0.01, 0.1)])
def test_both_names_of_a_renamed_key_must_agree(old, new, value, other):
    # Same value (a list is the same tuple): accepted. The new name at its default counts as
    # unset, since configs.defaults writes every key: the old name's value is read. Another
    # value: a one-line error naming both.
    section = settings.RENAMED[f"proxies.{old}"].partition(".")[0]
    default = getattr(getattr(validate.parse({}), section), new)
    for new_value in (list(value) if isinstance(value, tuple) else value, default):
        run = validate.parse({"proxies": {old: value}, section: {new: new_value}})
        assert getattr(getattr(run, section), new) == value
    with pytest.raises(ValueError) as err:
        validate.parse({"proxies": {old: value}, section: {new: other}})
    assert str(err.value) == (f"proxies.{old}={value!r} and {section}.{new}={other!r}: "
                              f"proxies.{old} is the old name of {section}.{new}; set "
                              f"{section}.{new} only")


def test_an_old_name_in_a_file_or_on_the_command_line_is_read_with_the_doors_note():
    # The dyck_small config starts from configs.defaults (every new name at its default); the
    # launchers make the old names overridable (placeholders, unset until given).
    note = "note: proxies.{} is now {}; the old name goes in the next release"
    run, notes = validate.check(_command_line("--config.proxies.geometry=True",
                                              "--config.proxies.fit_sentences=5"))
    assert run.geometry.enabled and run.fit_shift.sentences == 5
    assert notes == [note.format("geometry", "geometry.enabled"),
                     note.format("fit_sentences", "fit_shift.sentences")]
    run, notes = validate.check(_command_line("--config.geometry.enabled=True"))
    assert run.geometry.enabled and notes == []
    config = _config("dyck_small")  # an old config file's own line
    config.cpu_devices, config.proxies.probe_ridge = 0, 0.25
    run, notes = validate.check(config)
    assert run.probes.ridge == 0.25 and notes == [note.format("probe_ridge", "probes.ridge")]
    with pytest.raises(ValueError, match=r"^proxies.fit_sentences=5 and fit_shift.sentences=6: "):
        validate.check(_command_line("--config.proxies.fit_sentences=5",
                                     "--config.fit_shift.sentences=6"))


def test_a_workdir_written_before_the_rename_is_read_and_resumed(tmp_path):
    # Its config.json holds the old names: read_stored reads them as the new keys, and the
    # run resumes under them (a renamed key is an analysis key under either name).
    from jaxillusions.training import train

    run = validate.parse({"geometry": {"enabled": True}, "probes": {"ridge": 0.5}})
    stored = run.to_dict()
    for old, new in settings.RENAMED.items():
        section, _, name = new.partition(".")
        stored["proxies"][old.partition(".")[2]] = stored[section].pop(name)
    for section in {new.partition(".")[0] for new in settings.RENAMED.values()}:
        assert not stored.pop(section)  # emptied: only the old names hold these values
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert validate.read_stored(str(tmp_path)) == run
    notes = train.claim_workdir(str(tmp_path), run)
    assert notes and all("(analysis setting;" in n for n in notes)
    assert validate.read_stored(str(tmp_path)) == run  # config.json now holds the new names
    assert "geometry" not in json.loads((tmp_path / "config.json").read_text())["proxies"]


def test_the_library_takes_settings_and_names_the_door_for_a_config():
    # Below the door a ConfigDict (or a mapping) is a one-line TypeError before any work,
    # saying how to get Settings; the Settings of validate.check are taken as they are.
    from jaxillusions.training import train

    config = _config("dyck_small")
    config.cpu_devices = 0  # the test process's devices (conftest.jax_started)
    calls = {"train.seed_list": lambda c: train.seed_list(c),
             "train.members": lambda c: train.members(c),
             "train.model_config": lambda c: train.model_config(c),
             "train.build": lambda c: train.build(c, splits={}),
             "train.claim_workdir": lambda c: train.claim_workdir("unused", c, record=False),
             "train.train_sweep": lambda c: train.train_sweep(c, "unused")}
    for name, call in calls.items():
        for wrong in (config, config.to_dict()):
            with pytest.raises(TypeError) as err:
                call(wrong)
            assert str(err.value) == (
                f"{name} takes Settings, not a {type(wrong).__name__}: call `settings, _ = "
                "validate.check(config)` first and pass those")
    run, _ = validate.check(config)
    assert len(train.seed_list(run)) == run.train.num_seeds
    assert train.model_config(run).d_model == run.model.d_model


def test_a_stored_run_is_read_at_its_own_door(tmp_path):
    # settings.read_stored: a workdir's config.json (lists for tuples) gives the Settings it
    # was written from; a missing, garbled or foreign file is one line naming it.
    run = validate.parse(_config("dyck_small"))
    path = tmp_path / "config.json"
    with pytest.raises(FileNotFoundError, match=f"^{path} not found: is {tmp_path} a "):
        validate.read_stored(str(tmp_path))
    path.write_text(json.dumps(run.to_dict()))
    assert validate.read_stored(str(tmp_path)) == run
    for text, why in [('{"train": {"lear', "JSONDecodeError: "),
                      ("[1]", "valid JSON, but a list, not a config"),
                      ('{"train": {"foo": 1}}', "unknown config key train.foo; allowed in train:")]:
        path.write_text(text)
        with pytest.raises(ValueError) as err:
            validate.read_stored(str(tmp_path))
        assert str(err.value).startswith(f"{path} is unreadable ({why}"), str(err.value)
        assert "\n" not in str(err.value)
    # A run that an earlier version let repeat a size (fitted once) is still read: the door
    # refuses the repeat in a config given now, not in a run stored before.
    stored = run.to_dict()
    stored["proxies"]["svd_ranks"] = [1, 2, 2]
    path.write_text(json.dumps(stored))
    assert validate.read_stored(str(tmp_path)).proxies.svd_ranks == (1, 2, 2)
    with pytest.raises(ValueError, match="2 is given twice"):
        validate.parse(stored)


def test_the_model_section_and_the_model_config_are_one_set_of_fields_and_defaults():
    # settings.Model's keys are the fields of model.ModelConfig that a config sets (its own
    # max_len, a lower bound on the model's, aside), with ModelConfig's defaults (one home)...
    from jaxillusions import model

    # The variants aside: they are built into a part and standing interventions.
    variants = {"uniform_attention_layers", "first_layer", "minimal_embedding"}
    section = settings.Model()
    # model.pretrained says where the model comes from (imported checkpoints), not what it is.
    keys = {f.name for f in dataclasses.fields(section)} - {"max_len", "pretrained"} - variants
    assert keys == set(model.SETTINGS_FIELDS)
    assert {k: getattr(section, k) for k in keys} == model.SETTINGS_FIELDS
    # ... and ModelConfig.from_settings carries each of them over: every value changed here.
    changed = dataclasses.replace(
        section, n_layers=3, n_heads=2, d_model=16, d_head=4, d_mlp=8, pos_encoding="rotary",
        rotary_base=100, attn_only=True, uniform_attention_layers=[1], embedding="onehot",
        compute_dtype="bfloat16")
    cfg = model.ModelConfig.from_settings(changed, vocab_size=7, max_len=9)
    assert not {k for k in keys if getattr(changed, k) == getattr(section, k)}
    assert {k: getattr(cfg, k) for k in keys} == {k: getattr(changed, k) for k in keys}
    # uniform_attention_layers becomes the model's standing intervention; the first layer is
    # built by the task (train.model_config).
    assert cfg.interventions == (model.UniformAttention((1,)),) and cfg.front is None
