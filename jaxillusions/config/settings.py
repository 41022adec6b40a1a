"""Every setting of a run: one frozen dataclass per config section, each field with its type,
default, rule and what is allowed (config/fields.py). The data.* section is the task's own
(`tasks.<name>.Data`); a study's section is declared beside its stage (`Stage.section`), and
`settings_class(studies)` is Settings with those sections as fields.

    settings = from_config(config, studies)   # a ConfigDict -> Settings, checked key by key

The door, pipeline/validate.py, calls these with the pipeline's study sections, and nothing else
does: `validate.check` (the launchers, and a notebook, once per run; it adds the checks that need
the resolved model: proxy sites, memory) and `validate.read_stored` (a stored run's config.json).
The library takes Settings, or one section of them, only (`require` turns a ConfigDict into a
one-line TypeError; tests/test_architecture.py fails on a from_config elsewhere). A missing key
takes its default; an unknown key, a value of the wrong kind, one its rule refuses or a tuple
giving a value twice is a one-line ValueError naming the key. docs/configs.md's reference is
`reference()` (a test keeps the two equal). Old names of study keys under proxies.*
(`RENAMED`) are read for one more release, with a note (`renamed`, which validate.check shows).

`ANALYSIS_KEYS` and every study section's keys (`Settings.is_analysis_key`) only change what is
measured or logged, not the trained parameters: they may change between a run and its resumption
(recorded in the workdir's config_history.jsonl). Every other key defines the training run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from jaxillusions import model, tasks
from jaxillusions.config import fields, grid_axes
from jaxillusions.config.fields import (
    BOOL,
    INT,
    INTS,
    NUMBER,
    NUMBERS,
    STR,
    STRS,
    anything,
    distinct,
    kind_of,
    nonnegative,
    one_of,
    positive,
    rule,
    setting,
)
from jaxillusions.model import patching
from jaxillusions.tasks import minimal_layer

# Keys (fnmatch patterns) that may change on resume: analysis, evaluation and logging settings.
ANALYSIS_KEYS = (
    "figures",
    "stall_seconds",
    "proxies.*",
    "train.eval_batch_size",
    "train.log_every",
    "train.eval_every",
    "train.eval_train_sentences",
    "train.checkpoint_every",
    "data.cache_dir",
)


# Keys renamed when the studies got sections of their own (old -> new). For one release a config
# (or a command line) may set the old name, read as the new one with a note (`renamed`); the two
# set differently is an error. An old name left None (the launchers' placeholder) is unset, as is
# a new name at its default (configs.defaults writes every key) but on the command line (common).
RENAMED = {
    "proxies.dictionary_match_seeds": "dictionaries.match_seeds",
    "proxies.geometry": "geometry.enabled",
    "proxies.repair_sentences": "geometry.repair_sentences",
    "proxies.probe_sites": "probes.sites",
    "proxies.probe_ridge": "probes.ridge",
    "proxies.fit_splits": "fit_shift.splits",
    "proxies.fit_sentences": "fit_shift.sentences",
}


def _below_layers(v, s) -> bool:
    return all(0 <= i < s.model.n_layers for i in v)


_ARCH = model.SETTINGS_FIELDS  # the architecture's defaults, one home: model.ModelConfig


@dataclasses.dataclass(frozen=True)
class Model:
    """The transformer (jaxillusions/model; model.ModelConfig checks the combinations and holds
    the defaults, model.SETTINGS_FIELDS, which these keys take, the variants' aside)."""

    n_layers: int = setting(_ARCH["n_layers"], INT, ">= 1", positive)
    n_heads: int = setting(_ARCH["n_heads"], INT, ">= 1", positive)
    d_model: int = setting(_ARCH["d_model"], INT, ">= 1", positive)
    d_head: int = setting(_ARCH["d_head"], INT, ">= 0 (0: d_model // n_heads)", nonnegative)
    d_mlp: int = setting(_ARCH["d_mlp"], INT, ">= 0", nonnegative)
    pos_encoding: str = setting(_ARCH["pos_encoding"], STR, *one_of(model.POS_ENCODINGS),
                                doc="rotary: queries and keys turned by position in every layer")
    rotary_base: int = setting(_ARCH["rotary_base"], INT, ">= 2", lambda v, s: v >= 2,
                               "rotary only: pair i of a head turns by base^(-2i/d_head) a step")
    attn_only: bool = setting(_ARCH["attn_only"], BOOL, "true or false")
    # The model's variants: ModelConfig.from_settings makes this one a standing intervention
    # (model.UniformAttention); train.model_config has the task build the first layer, a part.
    uniform_attention_layers: tuple[int, ...] = setting(
        (), INTS, "layer indices in [0, model.n_layers)",
        _below_layers, "layers whose attention is uniform over the prefix")
    embedding: str = setting(_ARCH["embedding"], STR, *one_of(model.EMBEDDINGS),
                             doc="onehot: frozen one-hot token embeddings")
    first_layer: str = setting("standard", STR, *one_of(minimal_layer.FIRST_LAYERS),
                               doc="minimal: Wen et al.'s (type, depth)-only first layer")
    minimal_embedding: str = setting("onehot", STR, *one_of(minimal_layer.FEATURES))
    # Not ModelConfig.max_len: a lower bound on it (that one covers the data and its prefixes).
    max_len: int = setting(0, INT, ">= 0 (0: the longest data split)", nonnegative,
                           "positions the model supports")
    compute_dtype: str = setting(_ARCH["compute_dtype"], STR, *one_of(model.COMPUTE_DTYPES),
                                 doc="bfloat16: bf16 matmuls, f32 parameters and softmax")
    pretrained: tuple[str, ...] = setting((), fields.PATHS, "checkpoint directories, or () to "
                                          "train", doc="imported members (docs/pretrained.md)")


LOSS_ON = ("all", "closing")
# The kinds of member (train.null), in the order of their codes, the `null` hyper-parameter.
NULL_KINDS = ("trained", "untrained", "shuffled")


@dataclasses.dataclass(frozen=True)
class Train:
    """The optimizer (AdamW, warmup, a constant peak rate if decay_steps says so, cosine decay)
    and the training loop."""

    num_seeds: int = setting(4, INT, ">= 1", positive, "seeds config.seed, config.seed + 1, ...")
    num_steps: int = setting(3000, INT, ">= 1", positive)
    batch_size: int = setting(32, INT, ">= 1", positive, "sentences per step and seed")
    rows_per_sentence: float = setting(1.0, NUMBER, "> 0 and <= 1", lambda v, s: 0 < v <= 1,
                                       "< 1: batches packed into ceil(this x batch_size) rows")
    learning_rate: float = setting(3e-3, NUMBER, "> 0", lambda v, s: v > 0)
    warmup_steps: int = setting(200, INT, ">= 0", nonnegative)
    decay_steps: int = setting(
        0, INT, "0 (every step after the warmup) or 1 .. num_steps - warmup_steps",
        lambda v, s: v == 0 or 1 <= v <= s.train.num_steps - s.train.warmup_steps,
        "the cosine decay's steps, the last of the run; the rate stays at its peak before them")
    weight_decay: float = setting(0.01, NUMBER, ">= 0", nonnegative)
    grad_clip: float = setting(1.0, NUMBER, "> 0", lambda v, s: v > 0)
    loss_on: str = setting("all", STR, *one_of(LOSS_ON),
                           doc="closing: next-token loss on closing brackets only")
    contrastive_weights: tuple[float, ...] = setting(
        (), NUMBERS, "distinct weights >= 0, or () for none",
        lambda v, s: all(w >= 0 for w in v) and distinct(v),
        "Wen et al. eq. 22; several: a member per weight (members: the product of the lists "
        "of hyper-parameters x seeds, trained together)")
    learning_rates: tuple[float, ...] = setting(
        (), NUMBERS, "distinct rates > 0, or () for train.learning_rate",
        lambda v, s: all(r > 0 for r in v) and distinct(v),
        "several: a member per peak rate (the schedule's shape is shared); replaces "
        "train.learning_rate")
    weight_decays: tuple[float, ...] = setting(
        (), NUMBERS, "distinct decays >= 0, or () for train.weight_decay",
        lambda v, s: all(d >= 0 for d in v) and distinct(v),
        "several: a member per AdamW weight decay; replaces train.weight_decay")
    init_scales: tuple[float, ...] = setting(
        (), NUMBERS, "distinct factors > 0, or () for 1",
        lambda v, s: all(f > 0 for f in v) and distinct(v),
        "several: a member per factor; multiplies a member's randomly drawn initial "
        "parameters (LayerNorm gains, zero biases and fixed tables stay)")
    null: tuple[str, ...] = setting(
        (), STRS, f"distinct kinds of {', '.join(NULL_KINDS[1:])}, or () for none",
        lambda v, s: set(v) <= set(NULL_KINDS[1:]),
        "null members: per trained member, a copy that keeps its initialisation (untrained) or "
        "trains on each row's targets in a random order (shuffled); hyper-parameter null: 0 "
        "trained, 1 untrained, 2 shuffled; imported checkpoints: untrained only, initialised here")
    log_every: int = setting(100, INT, ">= 1", positive)
    eval_every: int = setting(1000, INT, ">= 0 (0: only at the end)", nonnegative)
    checkpoint_every: int = setting(1000, INT, ">= 0 (0: only at the end)", nonnegative)
    eval_batch_size: int = setting(256, INT, ">= 1", positive)
    eval_train_sentences: int = setting(
        0, INT, ">= 0 (0: all)", nonnegative,
        "training sentences scored by the evaluations during training (the first N)")
    # A training key: the seeds a device batches together can change XLA's rounding
    # (docs/scaling_out.md). 1 is refused: a one-seed chunk would run the unbatched step.
    seed_chunk_size: int = setting(0, INT, "0 (all at once) or >= 2",
                                   lambda v, s: v == 0 or v >= 2,
                                   "seeds trained at once over all devices")
    max_position_offset: int = setting(
        0, INT, ">= 0, or -1 for as far as the model's positions allow", lambda v, s: v >= -1,
        "each training row starts at a random position in [0, this]")


@dataclasses.dataclass(frozen=True)
class Proxies:
    """The proxies, where they apply and the faithfulness evaluation (checked against the model
    in validate.py). A proxy file's options are fields here; a proxy file whose sizes key has no
    field gets one (`proxies_class`), so a new proxy needs nothing else to be a method."""

    targets: tuple[str, ...] = setting(
        ("blocks.-1.attn.q", "blocks.-1.attn.k", "blocks.-1.attn.q+blocks.-1.attn.k"), STRS,
        "at least one '+'-joined list of sites", lambda v, s: len(v) >= 1,
        "sites simplified together are joined by '+'; blocks.-1 is the last layer")
    eval_splits: tuple[str, ...] = setting(
        ("iid", "seen_structure", "unseen_structure", "unseen_depth", "longer",
         "iid_with_train"), STRS, "at least one split", lambda v, s: len(v) >= 1)
    gap_baseline: str = setting("iid", STR, "a split of proxies.eval_splits (checked below)",
                                doc="gaps are baseline minus split")
    pattern_site: str = setting("blocks.-1.attn.pattern", STR,
                                "an attention pattern site, e.g. blocks.-1.attn.pattern",
                                doc="where onehot_attention and uniform_attention apply")
    methods: tuple[str, ...] = setting(("svd", "kmeans", "onehot_attention",
                                        "uniform_attention"), STRS, "proxy methods, or () for none")
    svd_ranks: tuple[int, ...] = setting(
        (), INTS, "ranks >= 1, or () for 1, 2, 4, ... up to d_head",
        lambda v, s: all(r >= 1 for r in v))
    svd_center: bool = setting(False, BOOL, "true or false", doc="True: PCA")
    kmeans_sizes: tuple[int, ...] = setting(
        (2, 4, 8, 16, 32, 64), INTS, "cluster counts >= 1",
        lambda v, s: len(v) >= 1 and all(k >= 1 for k in v))
    kmeans_samples: int = setting(20_000, INT, ">= 1", positive, "vectors per seed fitted on")
    kmeans_iters: int = setting(25, INT, ">= 1", positive)
    # Lenses and concept erasure (docs/lenses.md); the erasure proxy's sizes are the concepts.
    concepts: tuple[str, ...] = setting(
        (), STRS, "distinct concepts of the task (dyck: depth, bracket; code: category; "
        "text: copyable)", doc="what erasure erases (its size c: concepts[c]) and what "
        "probes.sites probes")
    tuned_lens_ranks: tuple[int, ...] = setting(
        (), INTS, "ranks >= 0, or () for d_model", lambda v, s: all(r >= 0 for r in v),
        "ranks of the tuned lens's correction to the identity (0: mean shift only)")
    tuned_lens_ridge: float = setting(1e-4, NUMBER, ">= 0", nonnegative,
                                      "ridge of the tuned lens, times Cov's mean eigenvalue")
    # Circuits (docs/circuits.md): the circuit proxy's families and how it is found.
    circuit_sizes: tuple[int, ...] = setting(
        (), INTS, "sizes >= 0, or () for 0, 1, 2, 4, ... up to every unit",
        lambda v, s: all(k >= 0 for k in v),
        "units (edges, nodes or neurons) a circuit keeps; clipped to how many there are")
    circuit_granularity: tuple[str, ...] = setting(
        ("edge",), STRS, f"at least one of {', '.join(patching.GRANULARITIES)}",
        lambda v, s: len(v) >= 1 and set(v) <= set(patching.GRANULARITIES),
        "what a circuit is made of: edges, nodes (heads and MLPs) or neurons (heads and MLP "
        "neurons)")
    circuit_ablation: tuple[str, ...] = setting(
        ("mean",), STRS, f"at least one of {', '.join(patching.ABLATIONS)}",
        lambda v, s: len(v) >= 1 and set(v) <= set(patching.ABLATIONS),
        "what ablated units take: zero, their fit-split mean, or their value on another "
        "sentence")
    circuit_direction: str = setting("complement", STR, *one_of(("complement", "circuit")),
                                     doc="ablate what lies outside the circuit, or the circuit")
    circuit_sentences: int = setting(2000, INT, ">= 0 (0: all)", nonnegative,
                                     "fit-split sentences a circuit is found on (the first)")
    circuit_metric: str = setting("kl", STR, *one_of(patching.METRICS),
                                  doc="attribution metric: KL to the model's output, or the "
                                  "logit of its prediction")
    collect_batch_size: int = setting(512, INT, ">= 1", positive,
                                      "training sentences per activation-collection chunk")
    eval_batch_size: int = setting(256, INT, ">= 1", positive)
    # An analysis key: it changes no number (docs/scaling_out.md).
    seed_chunk_size: int = setting(0, INT, ">= 0 (0: as many as fit the device)", nonnegative,
                                   "seeds per call of the proxy stage")


# Which figures the main job draws (figures/ and TensorBoard IMAGES; sweep.figure_jobs).
FIGURES = ("summary", "all", "none")

# The sections every run has; a study's section (its settings, declared beside its stage) is a
# field of the class `settings_class` makes for the pipeline's studies.
SECTIONS = {"model": Model, "train": Train, "proxies": Proxies}


# JAX takes 2.9 s and 0.3 GB to start 1,024 CPU devices, 39 s and 1 GB for 8,192 (AMD EPYC),
# and never returns for 10**15: the cap keeps a typo from hanging the launch.
MAX_CPU_DEVICES = 1024
SEED_END = 2**32  # the members' seeds, config.seed + s, are 32-bit (training.step.init_state)


@dataclasses.dataclass(frozen=True)
class Settings:
    """A whole run. Seed s of the sweep is `seed + s`."""

    task: str = setting("dyck", STR, *one_of(tasks.TASKS))
    seed: int = setting(0, INT, f">= 0, with seed + train.num_seeds at most {SEED_END} (the "
                        "members' seeds are 32-bit: seed and seed + 2**32 would train the "
                        "same models)", lambda v, s: 0 <= v and v + s.train.num_seeds <= SEED_END)
    cpu_devices: int = setting(
        0, INT, f"0 to {MAX_CPU_DEVICES} (0: as JAX starts: $JAX_NUM_CPU_DEVICES, else 1)",
        lambda v, s: 0 <= v <= MAX_CPU_DEVICES,
        "JAX devices the CPU is split into, the seeds sharded over them (one per core); "
        "ignored on a GPU. It changes the numbers' last bits")
    gpu_deterministic: bool = setting(
        True, BOOL, "true or false",
        doc="deterministic GPU kernels (XLA's --xla_gpu_deterministic_ops), so that a GPU run "
        "gives the same bits every time; false trains about 3.4x faster on an H100 (the dyck "
        "config's model, 32 seeds) with numbers that change from run to run. Ignored on "
        "a CPU, whose kernels are deterministic")
    figures: str = setting(
        "summary", STR, *one_of(FIGURES),
        doc="which figures the main job draws (docs/configs.md, Figures): summary (gaps, "
        "faithfulness, categories, attention patterns, one key projection) or all (also "
        "accuracy per bin of every proxy family, every key projection) or none (for batch "
        "work; the studies' own figures are still drawn); `jaxillusions figures W` draws "
        "the rest later")
    stall_seconds: float = setting(
        600, NUMBER, ">= 0 (0: no watchdog)", lambda v, s: v >= 0,
        "seconds without progress (a training chunk, a batch of activations, a proxy family) "
        "and without CPU use (a deadlock, a lost peer) after which the main job ends with a "
        "one-line error naming what stalled and a stack dump in the workdir "
        "(runtime/watchdog.py); relaunching resumes")
    grid: tuple[str, ...] = setting(
        (), STRS, "entries key=value1,value2,... (config/grid_axes.py)",
        lambda v, s: all(map(grid_axes.entry_ok, v)),
        "settings that change shapes (model.n_layers, model.d_model, ...): one run per point "
        "of their product, each in <workdir>/<key>=<value>, joined in one population table")
    data: Any = None  # the task's Data
    model: Model = dataclasses.field(default_factory=Model)
    train: Train = dataclasses.field(default_factory=Train)
    proxies: Proxies = dataclasses.field(default_factory=Proxies)
    # The study sections: fields of settings_class(studies), the class the door parses into.
    STUDIES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def is_analysis_key(cls, key: str) -> bool:
        """True for keys that may change between a run and its resumption (ANALYSIS_KEYS, and
        every key of a study section: a study measures the trained members)."""
        return any(fnmatch.fnmatchcase(key, pattern)
                   for pattern in (*ANALYSIS_KEYS, *(f"{name}.*" for name in cls.STUDIES)))

    def defaults(self) -> Settings:
        """A run of the same task and study sections with every key at its default."""
        return type(self)(task=self.task, data=type(self.data)(), proxies=proxies_class()())

    def to_dict(self) -> dict:
        """Nested {section: {key: value}} with lists for tuples (what config.json holds)."""
        return _plain(dataclasses.asdict(self))

    def replace(self, **changes: dict) -> Settings:
        """A copy with some keys of some sections changed: replace(train={"num_steps": 5})."""
        return dataclasses.replace(self, **{
            name: dataclasses.replace(getattr(self, name), **keys) if isinstance(keys, dict)
            else keys for name, keys in changes.items()})


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return list(map(_plain, value)) if isinstance(value, tuple | list) else value


def proxies_class() -> type:
    """Proxies, plus for every proxy file: a field for its sizes key when Proxies does not name
    it (sizes >= 1, default ()), for a vector proxy `<name>_targets` (its own targets;
    default (): proxies.targets), and its own keys (its OPTIONS). Adding a proxy is adding a
    file (proxies/__init__.py)."""
    from jaxillusions import proxies  # noqa: PLC0415 - the proxy files, found on first use

    return _proxies_class(proxies.available())


@functools.cache
def _proxies_class(names: tuple[str, ...]) -> type:
    from jaxillusions import proxies  # noqa: PLC0415

    options = {key: field for name in names
               for key, field in proxies.hook(proxies.get(name), "OPTIONS").items()}
    known = {f.name for f in dataclasses.fields(Proxies)} | set(options)
    extra = [(key, tuple, setting((), INTS, f"{name} sizes >= 1",
                                  lambda v, s: all(k >= 1 for k in v), f"sizes of {name}"))
             for name in names
             if proxies.get(name).STATISTIC is not None
             and (key := proxies.sizes_key(proxies.get(name))) not in known]
    extra += [(f"{name}_targets", tuple, setting(
        (), STRS, "'+'-joined lists of sites, or () for proxies.targets",
        doc=f"the sites {name} is fitted on, if not proxies.targets"))
        for name in proxies.available() if proxies.get(name).SITE == "vector"]
    extra += [(key, Any, dataclasses.field(default=field.default, metadata=field.metadata))
              for key, field in options.items()]
    if not extra:
        return Proxies
    return dataclasses.make_dataclass("Proxies", extra, bases=(Proxies,), frozen=True)


Studies = tuple[tuple[str, type], ...]  # (section name, its dataclass) of each study


@functools.cache
def settings_class(studies: Studies = ()) -> type[Settings]:
    """Settings with a field per study section (the pipeline's stages declare them: the door,
    pipeline/validate.py, passes them), each at its defaults unless a config sets its keys."""
    if not studies:
        return Settings
    taken = [name for name, _ in studies if name in {f.name for f in dataclasses.fields(Settings)}]
    if taken or len({name for name, _ in studies}) != len(studies):
        raise ValueError(f"study sections {[n for n, _ in studies]}: each name once, none of "
                         f"the run's own ({taken or 'duplicates'})")
    cls = dataclasses.make_dataclass(
        "Settings", [(name, section, dataclasses.field(default_factory=section))
                     for name, section in studies],
        bases=(Settings,), frozen=True, namespace={"STUDIES": tuple(n for n, _ in studies)})
    cls.__module__, cls.__qualname__ = __name__, "Settings"  # reads as Settings in messages
    return cls


def _section_classes(task: str, studies: Studies) -> dict[str, type]:
    return {"data": tasks.get(task).Data, **SECTIONS, "proxies": proxies_class(),
            **dict(studies)}


def _fail_unknown(key: str, known) -> None:
    section = key.rsplit(".", 1)[0] if "." in key else "the top level"
    raise ValueError(f"unknown config key {key}; allowed in {section}: "
                     f"{', '.join(sorted(known))} (a new key needs a field in "
                     "jaxillusions/config/settings.py, in its task's Data for data.*, or in "
                     "its study's section)")


def _typed(key: str, value: Any, field: dataclasses.Field) -> Any:
    r = rule(field)
    if not r.kind[1](value):
        raise ValueError(f"{key}={value!r}: must be {r.kind[0]}"
                         + (f", {r.allowed}" if r.test is not anything else ""))
    fields.within_float32(key, value, r.kind)
    return (r.convert or (lambda v: v))(tuple(value) if isinstance(value, list | tuple) else value)


def _build(cls: type, values: dict, prefix: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            _fail_unknown(prefix + key, fields)
    return cls(**{k: _typed(prefix + k, v, fields[k]) for k, v in values.items()})


def from_config(config: Any, studies: Studies = (), stored: bool = False) -> Settings:
    """Settings (of settings_class(studies)) from an ml-collections ConfigDict (or a nested
    mapping, or Settings: returned as is). ValueError (one line: key, value, what is allowed)
    for the first bad key; `stored` (a run's config.json) takes a repeated value as given."""
    if isinstance(config, Settings):
        return config
    raw = _renamed(_raw(config), dict(studies))
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in raw.items() if isinstance(v, dict)}
    top_fields = {f.name: f for f in dataclasses.fields(Settings) if f.name not in {
        "data", *SECTIONS}}
    for key in top:
        if key not in top_fields:
            _fail_unknown(key, [*top_fields, "data", *SECTIONS, *dict(studies)])
    top = {k: _typed(k, v, top_fields[k]) for k, v in top.items()}
    task = top.get("task", "dyck")
    if task not in tasks.TASKS:
        raise ValueError(f"task={task!r}: must be one of {', '.join(tasks.TASKS)}")
    classes = _section_classes(task, studies)
    for name in nested:
        if name not in classes:
            _fail_unknown(name, [*top_fields, *classes])
    sections = {name: _build(cls, nested.get(name, {}), f"{name}.")
                for name, cls in classes.items()}
    settings = settings_class(studies)(**top, **sections)
    for key, value, field in _leaves(settings):
        r = rule(field)
        if not r.test(value, settings):
            raise ValueError(f"{key}={value!r}: must be {r.allowed}")
        if not stored:  # (older versions let a run repeat a size: it was fitted once)
            fields.given_once(key, value, r.kind)
    return settings


def renamed(config: Any) -> list[str]:
    """One note for each old name of RENAMED that `config` (as from_config takes it) sets."""
    if isinstance(config, Settings):
        return []
    raw = _raw(config)
    return [f"note: {old} is now {new}; the old name goes in the next release"
            for old, new in RENAMED.items() if _value(raw, old) is not None]


def _raw(config: Any) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _value(raw: dict, key: str) -> Any:
    section, _, name = key.partition(".")
    return raw[section].get(name) if isinstance(raw.get(section), dict) else None


def _renamed(raw: dict, studies: Mapping[str, type]) -> dict:
    """`raw` with RENAMED's old names read as the new ones (a copy; unset old names dropped); a
    one-line ValueError when a config sets both names of a pair to different values."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for old, new in RENAMED.items():
        old_value, new_value = _value(raw, old), _value(raw, new)
        if old_value is None:
            if isinstance(raw.get("proxies"), dict):
                raw["proxies"].pop(old.partition(".")[2], None)
            continue
        section, _, name = new.partition(".")
        if section not in studies:  # a study not read here (read_stored without studies)
            del raw["proxies"][old.partition(".")[2]]
            continue
        default = next(f.default for f in dataclasses.fields(studies[section]) if f.name == name)
        if new_value is not None and _plain(new_value) not in (_plain(old_value),
                                                                _plain(default)):
            raise ValueError(f"{old}={old_value!r} and {new}={new_value!r}: {old} is the old "
                             f"name of {new}; set {new} only")
        if not isinstance(raw.setdefault(section, {}), dict):
            continue  # a section that is not one: from_config names it
        raw[section][name] = old_value
        del raw["proxies"][old.partition(".")[2]]
    return raw


def require(config: Any, where: str) -> Settings:
    """`config` if it is Settings, else a one-line TypeError: the library takes checked settings,
    never a ConfigDict or a mapping (those are read at the door, validate.check)."""
    if not isinstance(config, Settings):
        raise TypeError(f"{where} takes Settings, not a {type(config).__name__}: call "
                        "`settings, _ = validate.check(config)` first and pass those")
    return config


def read_stored(workdir: str, studies: Studies = ()) -> Settings:
    """The Settings of a stored run: its workdir's config.json (written when the run claimed the
    workdir), read key by key as from_config reads a config, with the study sections `studies`
    (validate.read_stored passes the pipeline's); without them (report/results.load_run), each
    study section as stored, its values typed by what they are. The checks against the machine
    (validate.check) are not repeated.
    FileNotFoundError if there is no config.json; ValueError (one line, naming the file) if it
    is unreadable or not a config this version reads."""
    path = os.path.join(workdir, "config.json")  # checkpoint.CONFIG_FILE (a module with orbax)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir} a jaxillusions workdir?")
    try:
        with open(path) as f:
            stored = json.load(f)
        if not isinstance(stored, dict):
            raise ValueError(f"valid JSON, but a {type(stored).__name__}, not a config")
        return from_config(stored, studies or _as_stored(stored), stored=True)
    except (OSError, ValueError) as err:  # garbage, or JSON that is not a config: name the file
        line = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{path} is unreadable ("
                         + (line if type(err) is ValueError else f"{type(err).__name__}: {line}")
                         + ")") from None


def _as_stored(stored: dict) -> Studies:
    """A section for each study section of a stored config.json, its keys typed by their stored
    values (kind_of) and otherwise unchecked: what read_stored gives without the stages."""
    def section(name: str, values: dict) -> type:
        return dataclasses.make_dataclass(name, [
            (key, object, setting(tuple(v) if isinstance(v, list) else v, kind_of(v), "as stored"))
            for key, v in values.items()], frozen=True)

    return tuple((name, section(name, values)) for name, values in stored.items()
                 if isinstance(values, dict) and name not in ("data", *SECTIONS))


def _leaves(settings: Settings):
    """(dotted key, value, field) of every setting."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            for sub in dataclasses.fields(value):
                yield f"{field.name}.{sub.name}", getattr(value, sub.name), sub
        else:
            yield field.name, value, field


def flat(settings: Settings) -> dict[str, Any]:
    """{"model.d_model": 32, ...} for every setting."""
    return {key: value for key, value, _ in _leaves(settings)}


def default_settings(task: str = "dyck", studies: Studies = ()) -> Settings:
    """A run of `task` with every key at its default (what a config of `task` alone reads as)."""
    return settings_class(studies)(task=task, data=tasks.get(task).Data(),
                                   proxies=proxies_class()())


def defaults(task: str = "dyck", studies: Studies = ()) -> dict[str, Any]:
    """Every key of a run of `task` at its default, nested as a config is ({"seed": 0, "train":
    {"num_steps": 3000, ...}, ...}; tuples stay tuples). The launchers add the keys a config
    file leaves out from here, so that any key can be overridden on the command line."""
    nested: dict[str, Any] = {}
    for key, value, _ in _leaves(default_settings(task, studies)):
        section, _, name = key.rpartition(".")
        (nested.setdefault(section, {}) if section else nested)[name] = value
    return nested


def reference(task: str | None = None, studies: Studies = ()) -> str:
    """A markdown table of keys, types, defaults and rules: every section but data.* (None), or
    a task's data.* section. docs/configs.md holds these tables (`python -m
    jaxillusions.config.settings` prints them; a test keeps the page equal to them)."""
    lines = ["| key | type | default | allowed | notes |", "|---|---|---|---|---|"]
    defaults = default_settings(task or "dyck", studies)
    for key, value, field in _leaves(defaults):
        if (task is None) == key.startswith("data."):
            continue
        r = rule(field)
        cells = [f"`{key}`", r.kind[0], f"`{value!r}`", r.allowed, r.doc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)

