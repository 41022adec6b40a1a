"""Transcoders on imported architectures (proxies/transcoder.py): on tiny random GPT-NeoX
checkpoints made with `transformers` (tests/test_pretrained.py's helpers) with a layer-norm
epsilon other than the default, with attention and MLP in parallel (Pythia: the MLP reads
resid_pre) and in sequence, the transcoder's input (`input_of` of `input_site`) is the MLP's
input in the transformers forward, and a transcoder collected, fitted and evaluated by the
engine (faithfulness.collect, fit, evaluate, as the proxy stage runs them) reads it: its pairs,
its intervention and its rows' fvu, ce_score and kl_score equal the direct computation within
float32 rounding (tests/tolerance.py)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol
from test_pretrained import VARIANTS, VOCAB, T, _bounds, _hf_model, _one, _save, _tokens
from test_sae import _fvu_terms, _means

from jaxillusions import model as model_lib
from jaxillusions.model import pretrained
from jaxillusions.proxies import transcoder

torch = pytest.importorskip("torch")

# Not the default 1e-5: the epsilon the MLP's layer norm must take from the checkpoint, large
# enough against the residual streams' variance (up to about 10 here) that 1e-5 shows.
EPS = 0.1


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{variant: (transformers model, its saved directory)}: test_pretrained's two GPT-NeoX
    layouts (parallel, sequential) at layer-norm epsilon EPS."""
    root = tmp_path_factory.mktemp("transcoder_imported")
    out = {}
    for name in ("neox_parallel", "neox_sequential"):
        kind, options = VARIANTS[name]
        hf = _hf_model(kind, **options, layer_norm_eps=EPS)
        out[name] = (hf, _save(hf, root / name))
    return out


def _mlp_inputs(hf, tokens) -> list[np.ndarray]:
    """Each layer's MLP input [B, T, d_model] in the transformers forward (after its layer norm,
    of whichever residual stream it reads)."""
    got = {}
    handles = [layer.mlp.register_forward_pre_hook(
        lambda m, a, i=i: got.__setitem__(i, a[0].detach().numpy()))
        for i, layer in enumerate(hf.gpt_neox.layers)]
    try:
        with torch.no_grad():
            hf(torch.tensor(np.asarray(tokens)))
    finally:
        for handle in handles:
            handle.remove()
    return [got[i] for i in range(len(got))]


def _bound(cfg, layer: int, ref):
    """How far two float32 computations of block `layer`'s MLP input may differ: test_pretrained's
    bound of a site at that point of the forward (after the rotation, if any)."""
    return _bounds(cfg, {}, f"blocks.{layer}.mlp.hidden", ref)


@pytest.mark.parametrize("variant", ["neox_parallel", "neox_sequential"])
def test_the_transcoder_reads_what_the_mlp_reads(saved, variant):
    """input_site is resid_pre in parallel blocks and resid_mid otherwise; input_of it equals
    the transformers MLP's input, and the model's own MLP on it gives mlp.out. Either mistake
    (the other residual stream, the default epsilon) lies outside the bound: the test sees it."""
    hf, path = saved[variant]
    params, cfg = pretrained.load_pretrained(path)
    parallel = variant == "neox_parallel"
    assert cfg.parallel_residual == parallel and cfg.ln_eps == pytest.approx(EPS)
    p, tokens = _one(params), _tokens()
    theirs = _mlp_inputs(hf, tokens)
    reads = ("resid_pre", "resid_mid") if parallel else ("resid_mid", "resid_pre")
    names = [f"blocks.{i}.{s}" for i in range(cfg.n_layers)
             for s in (*reads, "mlp.hidden", "mlp.out")]
    _, cache = model_lib.forward(p, jnp.asarray(tokens), cfg, cache=names)
    gelu = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
            "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}[cfg.activation]
    for i in range(cfg.n_layers):
        site = f"blocks.{i}.mlp.out"
        assert transcoder.input_site(site, cfg) == f"blocks.{i}.{reads[0]}"
        h = transcoder.input_of(p, cfg, site, cache[transcoder.input_site(site, cfg)])
        ours = np.asarray(h, np.float64)
        bound = _bound(cfg, i, ours)
        assert np.all(np.abs(theirs[i] - ours) <= bound), (site, np.max(np.abs(theirs[i] - ours)))
        m = p["blocks"][i]["mlp"]
        out = np.asarray(gelu(h @ m["w_in"] + m["b_in"]) @ m["w_out"] + m["b_out"], np.float64)
        want = np.asarray(cache[site], np.float64)
        assert np.all(np.abs(out - want) <= _bounds(cfg, {}, site, want)), site
        for wrong in (model_lib.mlp_input(p, i, cache[f"blocks.{i}.{reads[1]}"], cfg.ln_eps),
                      model_lib.mlp_input(p, i, cache[f"blocks.{i}.{reads[0]}"])):  # eps 1e-5
            assert np.any(np.abs(theirs[i] - np.asarray(wrong, np.float64)) > bound)


def test_a_transcoder_is_fitted_and_evaluated_on_an_imported_parallel_model(saved):
    """The engine's path on Pythia's layout at epsilon EPS: collect's pairs are the transformers
    MLP's inputs and outputs, the fitted transcoder's intervention replaces mlp.out by the
    transcoder of the MLP's input, and the evaluated rows' fvu, ce_score and kl_score equal
    those computed directly from that forward pass (test_sae's direct computation)."""
    from jaxillusions.faithfulness import collect, evaluate, fit
    from jaxillusions.faithfulness.specs import ProxySpec

    hf, path = saved["neox_parallel"]
    params, cfg = pretrained.load_pretrained([path])  # one member, seed 1 in the rows
    p = _one(params)
    layer, site, width = 1, "blocks.1.mlp.out", 16
    rng = np.random.RandomState(5)
    train = types.SimpleNamespace(tokens=rng.randint(1, VOCAB, (48, T)))  # no PAD (token 0)
    spec = ProxySpec("transcoder", (site,), (width,),
                     (("k", 4), ("steps", 200), ("lr", 3e-3), ("batch_size", 64)))
    quiet = collect.Chunking(0, None)
    samples = 500
    stats = collect.collect(params, train, cfg, [spec], num_samples=samples, batch_size=16,
                            chunking=quiet)
    pairs = stats[site]["pairs"]
    mlp_in = _mlp_inputs(hf, train.tokens)[layer].reshape(-1, cfg.d_model)[:samples]
    x = np.asarray(pairs["x"][0, 0], np.float64)
    assert np.all(np.abs(x - mlp_in) <= _bound(cfg, layer, x))
    _, cache = model_lib.forward(p, jnp.asarray(train.tokens), cfg, cache=(site,))
    y = np.asarray(cache[site], np.float64).reshape(-1, cfg.d_model)[:samples]
    assert np.all(np.abs(np.asarray(pairs["y"][0, 0]) - y) <= _bounds(cfg, {}, site, y))

    (fitted,) = fit.fit([spec], stats, jax.random.PRNGKey(0), 1, chunking=quiet)
    tokens = rng.randint(1, VOCAB, (32, T))
    evaluated = np.ones(tokens.shape, bool)
    evaluated[:, -1] = False  # its target would wrap around
    eval_set = evaluate.EvalSet(("iid",), tokens, evaluated, np.zeros((*tokens.shape, 1), np.int32),
                                (1,), ("all",), (1,), (T,))
    rows = evaluate.evaluate(params, cfg, eval_set, [fitted], batch_size=16, seeds=[1],
                             options=evaluate.EvalOptions(chunking=quiet))
    (row,) = [r for r in rows if r["breakdown"] == "all"]
    assert (row["method"], row["site"], row["size"], row["seed"]) == ("transcoder", site, width, 1)

    tokens = jnp.asarray(tokens)
    logits, cache = model_lib.forward(p, tokens, cfg, cache=(f"blocks.{layer}.resid_pre", site))
    tc = jax.tree.map(lambda a: a[0, 0, 0], fitted.params[site])  # seed, head, size
    want = np.asarray(transcoder.apply(tc, transcoder.input_of(
        p, cfg, site, cache[f"blocks.{layer}.resid_pre"])), np.float64)
    replaced, replaced_cache = model_lib.forward(
        p, tokens, cfg, intervention=fitted.intervention(0, 0, p, cfg), cache=(site,))
    assert np.all(np.abs(np.asarray(replaced_cache[site]) - want)
                  <= tol.two_ways(tol.activation_error(want, cfg.d_mlp + 2 * width)
                                  + tol.rotation_error(want, T - 1)))
    terms = _fvu_terms(cache[site], want, np.ones(tokens.shape, bool))
    assert 0 < row["fvu"] < 1
    assert row["fvu"] == pytest.approx(terms["err"] / terms["total"],
                                       abs=tol.fvu_tolerance(**terms, width=cfg.d_mlp))
    zeroed, _ = model_lib.forward(
        p, tokens, cfg, intervention=lambda n, v: jnp.zeros_like(v) if n == site else v)
    means = _means(logits, replaced, zeroed, jnp.roll(tokens, -1, axis=1), evaluated)
    n = means.pop("n")
    bound = tol.score_tolerances(n, *means.values())
    ce = (means["ce_zero"] - means["ce_proxy"]) / (means["ce_zero"] - means["ce_original"])
    kl = (means["kl_zero"] - means["kl_proxy"]) / means["kl_zero"]
    for name, direct in (("ce_score", ce), ("kl_score", kl)):
        assert np.isnan(row[name]) or abs(row[name] - direct) <= bound[name], (name, row, direct)
    assert not np.isnan(row["kl_score"])
