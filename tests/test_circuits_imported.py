"""Circuits at node and neuron granularity on imported architectures (model/patching.py,
proxies/circuit.py). Tiny random checkpoints made with `transformers` (tests/test_pretrained.py's
helpers): GPT-NeoX in Pythia's layout (attention and MLP in parallel, rotary on a quarter of each
head) at a layer-norm epsilon other than the default, and GPT-2, both with every bias and
layer-norm gain drawn at random (transformers initialises biases to zero, which would hide a
mishandled attention output bias b_O). Node and neuron patching go through `forward`'s sites, so:
with every unit kept the patched model is `forward` bit for bit; a head, an MLP or a neuron
zero-ablated is the transformers model with that unit's output zeroed by a torch hook (within
float32 rounding, tests/tolerance.py), b_O kept as in trained models; a head mean-ablated is
`forward` with its `attn.z` slice set to the mean; attribution patching's node scores predict
each node's ablation to first order. Edges (the edge forward recomputes the trained
architecture) are refused at the door in one line, and a run on imported checkpoints with node
circuits writes circuit rows on every split."""

import csv
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from test_pretrained import INIT, VARIANTS, _bounds, _hf_model, _one, _save, _tokens

from jaxillusions import model as model_lib
from jaxillusions.model import patching, pretrained

torch = pytest.importorskip("torch")

# Not the default 1e-5: an epsilon the layer norms must take from the checkpoint (as
# tests/test_transcoder_imported.py).
EPS = 0.1
MODELS = {
    "neox_parallel": ("gpt_neox", {**VARIANTS["neox_parallel"][1], "layer_norm_eps": EPS}),
    "gpt2": VARIANTS["gpt2"],
}


def _randomise_biases(hf, seed: int = 7):
    """Every bias ~ N(0, INIT^2) and every layer-norm gain 1 + N(0, INIT^2), in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(INIT * torch.randn(module.weight.shape, generator=gen))
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.copy_(INIT * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{variant: (transformers model, one member's params, its ModelConfig)}."""
    root = tmp_path_factory.mktemp("circuits_imported")
    out = {}
    for name, (kind, options) in MODELS.items():
        hf = _hf_model(kind, **options)
        _randomise_biases(hf)
        params, cfg = pretrained.load_pretrained(_save(hf, root / name))
        out[name] = (hf, _one(params), cfg)
    neox = out["neox_parallel"][2]
    assert neox.parallel_residual and neox.rotary_dim == neox.head_dim // 4
    assert neox.ln_eps == pytest.approx(EPS) and neox.rotary_layout == "half"
    assert out["gpt2"][2].key_bias
    return out


def _unit(name: str) -> tuple:
    """A unit of patching.node_names -> ("head", layer, h) | ("mlp", layer) | ("neuron",
    layer, i)."""
    parts = name.split(".")
    layer = int(parts[1])
    if parts[2] == "attn":
        return "head", layer, int(parts[3].removeprefix("head"))
    return ("neuron", layer, int(parts[4])) if len(parts) == 5 else ("mlp", layer)


def _hf_logits(hf, tokens, unit=None, drop_out_bias: bool = False, keep: float = 0.0
               ) -> np.ndarray:
    """The transformers model's logits [B, T, vocab] with `unit` (_unit's) output multiplied by
    `keep` (0: zeroed): a head's slice of the attention output projection's input (heads are
    contiguous there, as test_pretrained's z), the MLP's output, or one neuron's column of the
    MLP's output projection's input. `drop_out_bias`: also without the head's layer's b_O (a
    wrong ablation, to show the test sees b_O)."""
    gpt2 = hf.config.model_type == "gpt2"
    blocks = hf.transformer.h if gpt2 else hf.gpt_neox.layers
    handles = []

    def zero(lo, hi):
        def hook(module, args):
            x = args[0].clone()
            x[..., lo:hi] = keep * x[..., lo:hi]
            return (x, *args[1:])
        return hook

    if unit is not None:
        kind, layer, *index = unit
        block = blocks[layer]
        out_proj = block.attn.c_proj if gpt2 else block.attention.dense
        if kind == "head":
            e = hf.config.hidden_size // hf.config.num_attention_heads
            handles.append(out_proj.register_forward_pre_hook(zero(index[0] * e,
                                                                   (index[0] + 1) * e)))
            if drop_out_bias:
                handles.append(out_proj.register_forward_hook(lambda m, a, o: o - m.bias))
        elif kind == "neuron":
            down = block.mlp.c_proj if gpt2 else block.mlp.dense_4h_to_h
            handles.append(down.register_forward_pre_hook(zero(index[0], index[0] + 1)))
        else:
            handles.append(block.mlp.register_forward_hook(lambda m, a, o: keep * o))
    try:
        with torch.no_grad():
            return hf(torch.tensor(np.asarray(tokens))).logits.numpy().astype(np.float64)
    finally:
        for handle in handles:
            handle.remove()


def _mask(cfg, granularity: str, *names: str) -> jax.Array:
    units = patching.node_names(cfg, granularity)
    mask = jnp.ones(len(units))
    for name in names:
        mask = mask.at[units.index(name)].set(0.0)
    return mask


def _means(p, tokens, cfg, granularity):
    valid = jnp.ones(tokens.shape, bool)
    return jax.tree.map(lambda s: s / valid.sum(),
                        patching.unit_sums(p, tokens, cfg, granularity, valid))


# ---------------------------------------------------------------------------------------------
# Node and neuron patching against forward and the transformers model.


@pytest.mark.parametrize("granularity", ["node", "neuron"])
@pytest.mark.parametrize("variant", list(MODELS))
def test_every_unit_kept_is_the_model_bit_for_bit(saved, variant, granularity):
    """mask * value + (1 - mask) * ablated with every mask 1 is value exactly, whatever the
    ablated values, on the imported architecture too."""
    _, p, cfg = saved[variant]
    assert model_lib.imported_options(cfg)
    tokens = jnp.asarray(_tokens())
    ref = model_lib.forward(p, tokens, cfg)[0]
    ones = jnp.ones(patching.num_units(cfg, granularity))
    means = _means(p, tokens, cfg, granularity)
    for ablation in patching.ABLATIONS:
        ablated = patching.ablated_values(p, tokens, cfg, granularity, ablation, means)
        got = patching.masked_logits(p, tokens, cfg, granularity, ones, ablated)
        np.testing.assert_array_equal(got, ref, err_msg=ablation)


@pytest.mark.parametrize("variant", list(MODELS))
def test_a_unit_zero_ablated_is_the_transformers_model_with_it_zeroed(saved, variant):
    """A head (first and last layer), an MLP and a neuron, zero-ablated by node patching, equal
    the transformers forward with that unit's output zeroed by a hook, within test_pretrained's
    bound of the logits; each ablation moves the logits far past it, and so does dropping the
    head's layer's b_O as well (b_O is no head's: kept, as in trained models). In Pythia's
    parallel blocks a layer-0 head reaches the residual stream beside its own block's MLP,
    which reads resid_pre: the transformers model does that, and node patching agrees."""
    hf, p, cfg = saved[variant]
    tokens = _tokens()
    clean = np.asarray(model_lib.forward(p, jnp.asarray(tokens), cfg)[0], np.float64)
    last = cfg.n_layers - 1
    units = [("node", "blocks.0.attn.head1"), ("node", f"blocks.{last}.attn.head{cfg.n_heads - 1}"),
             ("node", "blocks.0.mlp"), ("neuron", f"blocks.{last}.mlp.hidden.5"),
             ("neuron", "blocks.0.attn.head2")]
    for granularity, name in units:
        ablated = patching.ablated_values(p, tokens, cfg, granularity, "zero")
        ours = np.asarray(patching.masked_logits(p, jnp.asarray(tokens), cfg, granularity,
                                                 _mask(cfg, granularity, name), ablated),
                          np.float64)
        theirs = _hf_logits(hf, tokens, _unit(name))
        bound = _bounds(cfg, {}, "logits", ours)
        excess = np.abs(theirs - ours) - bound
        assert np.all(excess <= 0), (name, float(np.max(excess)))
        assert np.max(np.abs(ours - clean)) > 100 * np.max(bound), name  # it ablates
        if _unit(name)[0] == "head":
            wrong = _hf_logits(hf, tokens, _unit(name), drop_out_bias=True)
            assert np.max(np.abs(wrong - ours)) > 100 * np.max(bound), name


def test_a_head_mean_ablated_is_forward_with_its_z_set_to_the_mean(saved):
    """Mean ablation of one head on Pythia's layout = forward with an explicit intervention
    setting that head's attn.z slice to its mean over the positions, bit for bit (the other
    heads' slices are 1 * z + 0 * mean, exactly z)."""
    _, p, cfg = saved["neox_parallel"]
    tokens = jnp.asarray(_tokens())
    means = _means(p, tokens, cfg, "node")
    site = "blocks.1.attn.z"
    _, cache = model_lib.forward(p, tokens, cfg, cache=(site,))
    np.testing.assert_allclose(means[site], cache[site].mean((0, 1)), rtol=1e-5, atol=1e-6)
    ablated = patching.ablated_values(p, tokens, cfg, "node", "mean", means)
    got = patching.masked_logits(p, tokens, cfg, "node", _mask(cfg, "node", "blocks.1.attn.head2"),
                                 ablated)

    def explicit(name, value):
        return value.at[:, :, 2].set(means[site][2]) if name == site else value

    np.testing.assert_array_equal(got, model_lib.forward(p, tokens, cfg, intervention=explicit)[0])


# ---------------------------------------------------------------------------------------------
# Attribution patching.


@pytest.mark.parametrize("variant", list(MODELS))
def test_node_attribution_is_the_first_order_effect_of_each_nodes_ablation(saved, variant):
    """Metric "logit" (linearised at the model), zero ablation: each node's score is d metric /
    d mask at mask 1. Against the transformers model (an ablation computed without patching.py)
    with that node's output scaled by 1 - d, the difference quotient e(d) = (metric(model) -
    metric(scaled)) / d: the same sign wherever |e(d)| is a tenth of the largest, the same
    ranking (Spearman >= 0.9), and |e(d) - score| within twice its truncation, estimated as
    |e(2d) - e(d)| (e is first order in d), plus twice the float32 rounding of the metric over
    d (the logits' per-row bound of test_pretrained, summed as random-sign errors, as
    tests/tolerance.py sums). And through node patching itself, the central difference of step
    h in the node's mask within |c(2h) - c(h)| (three times its truncation) plus that rounding
    over h. A whole node zeroed is far from first order in these random models (the logit
    saturates: Pythia's layer-0 MLP moves it by 76 where its score is -3.7), which is why the
    default metric, KL, is linearised at the midpoint (next test)."""
    hf, p, cfg = saved[variant]
    tokens = _tokens()
    weight = jnp.ones(tokens.shape)
    clean = model_lib.forward(p, jnp.asarray(tokens), cfg)[0]
    ablated = patching.ablated_values(p, tokens, cfg, "node", "zero")
    scores = np.asarray(patching.attribution(p, jnp.asarray(tokens), cfg, "node", ablated,
                                             weight, "logit"), np.float64)
    names = patching.node_names(cfg, "node")

    def metric(logits):
        return float(patching.metric(clean, jnp.asarray(logits, jnp.float32), weight, "logit"))

    rows = _bounds(cfg, {}, "logits", np.asarray(clean, np.float64))
    rounding = float(np.sqrt(np.sum(rows**2)))
    d = 0.05
    e1, e2 = (np.array([(metric(clean) - metric(_hf_logits(hf, tokens, _unit(n), keep=1 - s)))
                        / s for n in names]) for s in (d, 2 * d))
    big = np.abs(e1) >= 0.1 * np.max(np.abs(e1))
    rho = scipy.stats.spearmanr(scores, e1).statistic
    assert np.all(np.sign(scores[big]) == np.sign(e1[big])), (names, scores, e1)
    assert rho >= 0.9, (rho, scores, e1)
    bound = 2 * np.abs(e2 - e1) + 2 * rounding / d
    assert np.all(np.abs(e1 - scores) <= bound), (names, scores, e1, bound)

    def f(m, unit):
        mask = jnp.ones(len(names)).at[unit].set(m)
        return metric(patching.masked_logits(p, jnp.asarray(tokens), cfg, "node", mask,
                                             ablated))

    h = 0.05
    c1, c2 = (np.array([(f(1 + s, u) - f(1 - s, u)) / (2 * s) for u in range(len(names))])
              for s in (h, 2 * h))
    bound = np.abs(c2 - c1) + rounding / h
    assert np.all(np.abs(c1 - scores) <= bound), (names, scores, c1, bound)
    assert np.all(bound < 0.2 * np.abs(scores).max())  # a check that can fail


def test_kl_attribution_at_the_midpoint_predicts_each_nodes_ablation(saved):
    """Metric "kl" (the default; linearised at every mask 1/2) on Pythia's layout, mean
    ablation: each node's score against the change of KL(model || masked) when that node goes
    from ablated to kept with every other mask at 1/2 (the midpoint rule: first-order exact
    at the midpoint): the same sign wherever the change is a tenth of the largest, and Spearman
    correlation >= 0.8."""
    _, p, cfg = saved["neox_parallel"]
    tokens = jnp.asarray(_tokens())
    weight = jnp.ones(tokens.shape)
    clean = model_lib.forward(p, tokens, cfg)[0]
    ablated = patching.ablated_values(p, tokens, cfg, "node", "mean",
                                      _means(p, tokens, cfg, "node"))
    scores = np.asarray(patching.attribution(p, tokens, cfg, "node", ablated, weight, "kl"),
                        np.float64)
    n = len(scores)

    def f(unit, m):
        mask = jnp.full((n,), 0.5).at[unit].set(m)
        logits = patching.masked_logits(p, tokens, cfg, "node", mask, ablated)
        return float(patching.metric(clean, logits, weight, "kl"))

    effects = np.array([f(u, 1.0) - f(u, 0.0) for u in range(n)])
    big = np.abs(effects) >= 0.1 * np.max(np.abs(effects))
    rho = scipy.stats.spearmanr(scores, effects).statistic
    assert np.all(np.sign(scores[big]) == np.sign(effects[big])), (scores, effects)
    assert rho >= 0.8, (rho, scores, effects)


# ---------------------------------------------------------------------------------------------
# Edges refused; a run with node circuits.


def _one_line(err, *names):
    message = str(err.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, (name, message)


@pytest.mark.parametrize("variant", list(MODELS))
def test_edges_are_refused_on_an_imported_model_nodes_and_neurons_are_not(saved, variant):
    _, _, cfg = saved[variant]
    with pytest.raises(ValueError, match="imported architecture") as err:
        patching.num_units(cfg, "edge")
    _one_line(err, "proxies.circuit_granularity", "'edge'", "trained architecture", "'node'",
              "'neuron'")
    h, layers = cfg.n_heads, cfg.n_layers
    assert patching.num_units(cfg, "node") == layers * (h + 1)
    assert patching.num_units(cfg, "neuron") == layers * (h + cfg.d_mlp)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """tests/test_text_task.py's corpus (its helpers: a BPE tokenizer trained on this
    repository's task modules, text files train and other) and two tiny GPT-NeoX checkpoints
    of its vocabulary in Pythia's layout at layer-norm epsilon EPS."""
    pytest.importorskip("tokenizers")
    import test_text_task as text_tests

    root = tmp_path_factory.mktemp("circuits_text")
    out = {"train": str(root / "train.txt"), "other": str(root / "other.jsonl"),
           "tokenizer": str(root / "tokenizer.json"), "cache": str(root / "cache")}
    sources = text_tests.SOURCES
    pathlib.Path(out["train"]).write_text("\n<|endoftext|>\n".join(
        s.read_text() for s in sources[:4]))
    with open(out["other"], "w") as f:
        for paragraph in sources[4].read_text().split("\n\n"):
            f.write(json.dumps({"text": paragraph}) + "\n")
    out["vocab"] = text_tests._tokenizer([out["train"]], out["tokenizer"]).get_vocab_size()
    for seed in (1, 2):
        out[f"seed{seed}"] = text_tests._neox(root / "ckpt" / f"seed{seed}", out["vocab"], seed,
                                              layer_norm_eps=EPS)
    return out


def _text_config(corpus, **keys):
    import test_text_task as text_tests

    return text_tests._config(corpus, **{
        "proxies.methods": ("circuit",), "proxies.circuit_ablation": ("mean",),
        "proxies.circuit_sentences": 64, "figures": "none", **keys})


def test_the_door_refuses_edge_circuits_on_imported_checkpoints_before_the_weights(
        text_corpus, monkeypatch):
    from jaxillusions.pipeline import validate

    def no_weights(*args):
        raise AssertionError("weights read at the door")

    monkeypatch.setattr(pretrained, "_read_weights", no_weights)
    with pytest.raises(ValueError, match="^proxies.circuit_granularity: 'edge'") as err:
        validate.check(_text_config(text_corpus, **{
            "proxies.circuit_granularity": ("node", "edge")}))
    _one_line(err, "trained architecture", "'node'", "'neuron'")
    settings, _ = validate.check(_text_config(text_corpus, **{
        "proxies.circuit_granularity": ("node", "neuron")}))
    assert settings.proxies.circuit_granularity == ("node", "neuron")


def test_node_circuits_in_a_run_on_imported_checkpoints(text_corpus, tmp_path):
    """The main job (sweep.run, training skipped: the members are the two checkpoints) with the
    circuit proxy at node granularity, mean ablation: circuit rows in results.csv for every
    size, seed and split, the whole model at full size, and circuits.csv on every split."""
    from jaxillusions.pipeline import sweep, validate

    settings, _ = validate.check(_text_config(text_corpus, **{
        "proxies.circuit_granularity": ("node",)}))
    workdir = tmp_path / "run"
    sweep.run(settings, str(workdir), verbose=False)
    with open(workdir / "results.csv") as f:
        rows = [r for r in csv.DictReader(f)
                if r["method"] == "circuit" and r["breakdown"] == "all"]
    splits = {"iid", "other", "longer"}
    units = 2 * (2 + 1)  # 2 layers, 2 heads and an MLP each
    assert {r["site"] for r in rows} == {"circuit.node.mean"}
    assert {r["split"] for r in rows} == splits
    assert {(r["split"], int(r["seed"]), int(r["size"])) for r in rows} == {
        (s, seed, size) for s in splits for seed in (1, 2) for size in (0, 1, 2, 4, units)}
    full = [r for r in rows if int(r["size"]) == units]
    assert all(float(r["same_pred"]) == 1.0 and float(r["jsd"]) < 1e-6 for r in full), full
    assert any(float(r["same_pred"]) < 1.0 for r in rows if int(r["size"]) == 0)
    with open(workdir / "circuits.csv") as f:
        areas = list(csv.DictReader(f))
    assert {r["split"] for r in areas if r["site"] == "circuit.node.mean"} == splits
    assert all(0 <= float(r["mean"]) <= 1 for r in areas)
