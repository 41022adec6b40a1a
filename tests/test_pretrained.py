"""Pretrained checkpoints (model/pretrained.py): tiny random GPT-2 and GPT-NeoX models made with
`transformers`, saved as Hugging Face directories, loaded as our model; its logits and every site
with a Hugging Face counterpart (hidden states, attention patterns, and through hooks the
queries, keys, values, rotated queries and keys, z, attention and MLP outputs) equal the
transformers forward within float32 rounding (tests/tolerance.py). Also: populations on the
member axis, one-line refusals, and a TransformerLens export read back."""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol

from jaxillusions import model
from jaxillusions.model import pretrained

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB, T = 101, 16
# Weights 10x GPT-2's initialisation scale: scores of several units, so that attention patterns
# are far from uniform and a wrong rotation, scale or mask shows.
INIT = 0.2
COMMON = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, initializer_range=INIT,
              attn_implementation="eager")
VARIANTS = {
    "gpt2": ("gpt2", dict(n_layer=2, n_embd=48, n_head=4, n_positions=T)),
    # Stanford CRFM's Mistral runs: scores also / (layer + 1), computed in float32 first.
    "gpt2_mistral": ("gpt2", dict(n_layer=3, n_embd=32, n_head=2, n_inner=80, n_positions=T,
                                  scale_attn_by_inverse_layer_idx=True,
                                  reorder_and_upcast_attn=True, activation_function="gelu")),
    # Pythia's layout: rotary on a quarter of each head, attention and MLP in parallel.
    "neox_parallel": ("gpt_neox", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       intermediate_size=96, max_position_embeddings=T,
                                       rotary_pct=0.25, use_parallel_residual=True)),
    "neox_sequential": ("gpt_neox", dict(num_hidden_layers=2, hidden_size=48,
                                         num_attention_heads=2, intermediate_size=64,
                                         max_position_embeddings=T, rotary_pct=0.25,
                                         rotary_emb_base=100, use_parallel_residual=False,
                                         hidden_act="gelu_new", attention_bias=False)),
}


def _hf_model(kind: str, seed: int = 0, **options):
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(**COMMON, **options)
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.GPTNeoXConfig(**COMMON, **options)
    return transformers.GPTNeoXForCausalLM(cfg).eval()


def _save(hf, path, **kwargs):
    hf.save_pretrained(str(path), **kwargs)
    return str(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{variant: (transformers model, its saved directory)}."""
    root = tmp_path_factory.mktemp("pretrained")
    out = {}
    for name, (kind, options) in VARIANTS.items():
        hf = _hf_model(kind, **options)
        out[name] = (hf, _save(hf, root / name))
    return out


def _tokens(seed=0, batch=3):
    return np.random.RandomState(seed).randint(0, VOCAB, (batch, T))


def _one(params, i=0):
    return jax.tree.map(lambda x: x[i], params)


# ---------------------------------------------------------------------------------------------
# The transformers forward, site by site.


def _record(hf, kind: str, tokens, monkeypatch) -> dict:
    """Our site names -> the transformers model's values (numpy, our shapes) for `tokens`."""
    got, handles = {}, []
    n_layers = hf.config.num_hidden_layers
    heads = hf.config.num_attention_heads
    e = hf.config.hidden_size // heads

    def per_head(x):  # [B, T, heads * e] -> [B, T, heads, e]
        return x.reshape(*x.shape[:2], heads, -1)

    def out(module, site, transform=lambda x: x):
        handles.append(module.register_forward_hook(
            lambda m, a, o: got.__setitem__(site, transform(o.detach().numpy()))))

    def into(module, site, transform=lambda x: x):
        handles.append(module.register_forward_pre_hook(
            lambda m, a: got.__setitem__(site, transform(a[0].detach().numpy()))))

    def qkv(layer, split):
        def record(x):
            for name, value in zip("qkv", split(x), strict=True):
                got[f"blocks.{layer}.attn.{name}"] = value
        return record

    if kind == "gpt2":
        body = hf.transformer
        out(body.wte, "embed")
        out(body.wpe, "pos_embed", lambda x: x.reshape(T, -1))
        d = hf.config.hidden_size
        for i, block in enumerate(body.h):
            b = f"blocks.{i}"
            out(block.attn.c_attn, f"{b}.qkv",
                qkv(i, lambda x: [per_head(x[..., j * d:(j + 1) * d]) for j in range(3)]))
            into(block.attn.c_proj, f"{b}.attn.z", per_head)
            out(block.attn.c_proj, f"{b}.attn.out")
            into(block.ln_2, f"{b}.resid_mid")
            into(block.mlp.c_proj, f"{b}.mlp.hidden")
            out(block.mlp.c_proj, f"{b}.mlp.out")
        final = body.ln_f
    else:
        body = hf.gpt_neox
        out(body.embed_in, "embed")
        for i, layer in enumerate(body.layers):
            b, a = f"blocks.{i}", layer.attention
            out(a.query_key_value, f"{b}.qkv",
                qkv(i, lambda x: np.split(x.reshape(*x.shape[:2], heads, 3 * e), 3, axis=-1)))
            into(a.dense, f"{b}.attn.z", per_head)
            out(a.dense, f"{b}.attn.out")
            if not hf.config.use_parallel_residual:  # parallel: the MLP reads resid_pre
                into(layer.post_attention_layernorm, f"{b}.resid_mid")
            into(layer.mlp.dense_4h_to_h, f"{b}.mlp.hidden")
            out(layer.mlp.dense_4h_to_h, f"{b}.mlp.out")
        final = body.final_layer_norm
        # The queries and keys after the rotation: GPT-NeoX turns them in a function.
        from transformers.models.gpt_neox import modeling_gpt_neox as neox

        rotate, calls = neox.apply_rotary_pos_emb, []

        def recorded(q, k, *args, **kwargs):
            q, k = rotate(q, k, *args, **kwargs)
            layer = len(calls)
            calls.append(layer)
            for name, x in (("rot_q", q), ("rot_k", k)):  # [B, head, T, e] -> ours
                got[f"blocks.{layer}.attn.{name}"] = x.detach().numpy().transpose(0, 2, 1, 3)
            return q, k

        monkeypatch.setattr(neox, "apply_rotary_pos_emb", recorded)
    into(final, f"blocks.{n_layers - 1}.resid_post")
    out(final, "ln_final")
    try:
        with torch.no_grad():
            result = hf(torch.tensor(tokens), output_hidden_states=True, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    states = [h.numpy() for h in result.hidden_states]  # the embedding, each block's, ln_final
    for i in range(n_layers):
        got[f"blocks.{i}.resid_pre"] = states[i]
        got[f"blocks.{i}.attn.pattern"] = result.attentions[i].numpy()
        if i < n_layers - 1:
            got[f"blocks.{i}.resid_post"] = states[i + 1]
    assert np.array_equal(states[-1], got["ln_final"])
    got["logits"] = result.logits.numpy()
    return {k: v for k, v in got.items() if not k.endswith(".qkv")}


def _bounds(cfg, cache, site, ref):
    """How far two float32 computations of `site` may differ (tests/tolerance.py): an
    activation's rounding through matmuls of the widest width (MLP, model or vocabulary); with
    rotary positions, from the first rotation on, the rotation's rounding at angles up to T - 1
    (test_export's bound, and the angle of a turn computed two ways); an attention pattern by
    the softmax's conditioning from its scores' error, the error of dot products of queries
    and keys that carry those roundings."""
    width = max(cfg.d_mlp, cfg.d_model, cfg.vocab_size)
    names = model.site_names(cfg)
    rotary = cfg.pos_encoding == "rotary"
    turned = rotary and names.index(site) >= names.index("blocks.0.attn.rot_q")

    def error(x, turns):
        return tol.activation_error(x, width) + (tol.rotation_error(x, T - 1) if turns else 0)

    if not site.endswith(".attn.pattern"):
        return tol.two_ways(error(ref, turned))
    layer = int(site.split(".")[1])
    q, k = (np.asarray(cache[f"blocks.{layer}.attn.{'rot_' if rotary else ''}{x}"], np.float64)
            for x in "qk")
    eq, ek = error(q, rotary), error(k, rotary)  # [B, T, H, 1]
    nq, nk = np.linalg.norm(q, axis=-1), np.linalg.norm(k, axis=-1)  # [B, T, H]
    eq, ek = eq[..., 0].transpose(0, 2, 1), ek[..., 0].transpose(0, 2, 1)  # [B, H, T]
    nq, nk = nq.transpose(0, 2, 1), nk.transpose(0, 2, 1)
    scale = 1 / np.sqrt(cfg.head_dim) / ((layer + 1) if cfg.attn_scale_by_layer else 1)
    dots = nq[..., :, None] * nk[..., None, :]  # Cauchy-Schwarz: |q . k| <= |q| |k|
    score_error = scale * (eq[..., :, None] * nk[..., None, :] + nq[..., :, None] * ek[..., None, :]
                           + tol.sum_error(cfg.head_dim, dots))
    return tol.two_ways(tol.softmax_error(ref, cache[f"blocks.{layer}.attn.scores"], score_error))


# Our sites with no transformers counterpart: pre-softmax scores (never returned) and, with
# attention and MLP in parallel, resid_mid (resid_pre + attn.out, a sum GPT-NeoX never forms).
def _unmatched(cfg):
    layers = range(cfg.n_layers)
    return ({f"blocks.{i}.attn.scores" for i in layers}
            | ({f"blocks.{i}.resid_mid" for i in layers} if cfg.parallel_residual else set()))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_site_equals_the_transformers_forward(saved, variant, monkeypatch):
    hf, path = saved[variant]
    kind = VARIANTS[variant][0]
    params, cfg = pretrained.load_pretrained(path)
    assert jax.tree.leaves(params)[0].shape[0] == 1
    expected = {"gpt2": dict(pos_encoding="learned", key_bias=True, parallel_residual=False),
                "gpt_neox": dict(pos_encoding="rotary", rotary_layout="half", key_bias=True,
                                 rotary_dim=cfg.head_dim // 4)}[kind]
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.attn_scale_by_layer == (variant == "gpt2_mistral")
    assert kind == "gpt2" or cfg.rotary_base == (100 if variant == "neox_sequential" else 10_000)
    tokens = _tokens()
    logits, cache = model.forward(_one(params), jnp.asarray(tokens), cfg,
                                  cache=model.site_names(cfg))
    cache = {k: np.asarray(v) for k, v in cache.items()} | {"logits": np.asarray(logits)}
    got = _record(hf, kind, tokens, monkeypatch)
    assert set(got) == set(model.site_names(cfg)) - _unmatched(cfg), set(got) ^ set(cache)
    worst = {}
    for site, theirs in got.items():
        ours = cache[site].astype(np.float64)
        assert theirs.shape == ours.shape, (site, theirs.shape, ours.shape)
        bound = _bounds(cfg, cache, site, ours)
        excess = np.abs(theirs - ours) - bound
        assert np.all(excess <= 0), (site, float(np.max(excess)))
        worst[site] = float(np.max(np.abs(theirs - ours) / np.maximum(bound, 1e-30)))
    patterns = [cache[f"blocks.{i}.attn.pattern"] for i in range(cfg.n_layers)]
    assert max(p.max() for p in patterns) > 0.5  # far from uniform: the test can see a bug
    site = max(worst, key=worst.get)
    print(f"{variant}: {len(got)} sites, worst {site} at {worst[site]:.2g} of its bound")


def test_sharded_torch_and_bfloat16_files_load_the_same_weights(saved, tmp_path, monkeypatch):
    hf, path = saved["gpt2"]
    params, _ = pretrained.load_pretrained(path)
    with monkeypatch.context() as patched:  # without the extra: what to install, in one line
        patched.setitem(sys.modules, "safetensors", None)
        with pytest.raises(ValueError, match=r"model.safetensors needs safetensors to read "
                           r"\(pip install 'jaxillusions\[pretrained\]'\)$"):
            pretrained.load_pretrained(path)
    sharded = _save(hf, tmp_path / "sharded", max_shard_size="20KB")
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]) > 2
    binary = str(tmp_path / "binary")  # a pytorch_model.bin beside the same config.json
    os.makedirs(binary)
    shutil.copy(os.path.join(path, "config.json"), binary)
    torch.save(hf.state_dict(), os.path.join(binary, "pytorch_model.bin"))
    for other in (sharded, binary):
        same = jax.tree.map(np.array_equal, params, pretrained.load_pretrained(other)[0])
        assert all(jax.tree.leaves(same)), other
    hf_neox, _ = saved["neox_parallel"]  # stored in bfloat16: read through JAX's bfloat16
    half = _save(hf_neox.to(torch.bfloat16), tmp_path / "bf16")
    hf_neox.to(torch.float32)
    loaded = _one(pretrained.load_pretrained(half)[0])
    embed = hf_neox.gpt_neox.embed_in.weight.detach().to(torch.bfloat16).float().numpy()
    assert loaded["embed"].dtype == jnp.float32 and np.array_equal(loaded["embed"], embed)


def test_seeds_stack_on_the_member_axis(tmp_path):
    kind, options = VARIANTS["neox_parallel"]
    paths = [_save(_hf_model(kind, seed, **options), tmp_path / f"pythia-tiny-seed{seed}")
             for seed in (1, 2)]
    params, cfg, labels = pretrained.load_pretrained_labelled(paths)
    assert labels == ["seed1", "seed2"] and pretrained.load_pretrained(paths)[1] == cfg
    assert all(x.shape[0] == 2 for x in jax.tree.leaves(params))
    tokens = jnp.asarray(_tokens(1))
    both = jax.vmap(lambda p: model.forward(p, tokens, cfg)[0])(params)
    for i, path in enumerate(paths):
        alone, alone_cfg = pretrained.load_pretrained(path)
        assert alone_cfg == cfg
        assert all(jax.tree.leaves(jax.tree.map(lambda a, b, i=i: np.array_equal(a[i], b[0]),
                                                params, alone)))
        ref = np.asarray(model.forward(_one(alone), tokens, cfg)[0], np.float64)
        bound = tol.two_ways(tol.activation_error(ref, max(cfg.d_mlp, cfg.vocab_size))
                             + tol.rotation_error(ref, T - 1))
        assert np.all(np.abs(np.asarray(both[i]) - ref) <= bound)
    assert not np.allclose(both[0], both[1])  # two seeds, two models
    named = pretrained.load_pretrained_labelled({"a": paths[1], "b": paths[0]})
    assert named[2] == ["a", "b"] and np.array_equal(named[0]["embed"][0], params["embed"][1])


def test_member_labels_say_what_differs():
    labels = pretrained.member_labels
    assert labels(["/m/pythia-14m-seed1", "/m/pythia-14m-seed3"]) == ["seed1", "seed3"]
    assert labels(["/c/run/step1000", "/c/run/step20000"]) == ["step1000", "step20000"]
    assert labels(["/x/seed1/final", "/x/seed2/final"]) == ["seed1", "seed2"]
    assert labels(["/s/alias-gpt2-small-x21", "/s/battlestar-gpt2-small-x49"]) == [
        "alias-gpt2-small-x21", "battlestar-gpt2-small-x49"]
    assert labels("/m/pythia-14m") == ["pythia-14m"]
    with pytest.raises(ValueError, match="given twice"):
        labels(["/m/a", "/m/a"])


def _one_line(excinfo, *names):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, (name, message)


def test_refusals_are_one_line_and_come_before_the_weights(saved, tmp_path, monkeypatch):
    def no_weights(*args):
        raise AssertionError("weights read before the checks")

    monkeypatch.setattr(pretrained, "_read_weights", no_weights)
    gpt2, neox = saved["gpt2"][1], saved["neox_parallel"][1]
    with pytest.raises(ValueError, match="one architecture") as e:
        pretrained.load_pretrained([gpt2, neox])
    _one_line(e, gpt2, neox, "gpt2", "gpt_neox")
    wider = _save(_hf_model("gpt2", n_layer=2, n_embd=32, n_head=4, n_positions=T),
                  tmp_path / "wider")
    with pytest.raises(ValueError, match="model.d_model") as e:
        pretrained.load_pretrained([gpt2, wider])
    _one_line(e, gpt2, wider, "48", "32")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json") as e:
        pretrained.load_pretrained([gpt2, str(empty)])
    _one_line(e, str(empty))
    no_weights_dir = tmp_path / "config_only"
    no_weights_dir.mkdir()
    shutil.copy(os.path.join(gpt2, "config.json"), no_weights_dir)
    with pytest.raises(ValueError, match="no weights") as e:
        pretrained.load_pretrained(str(no_weights_dir))
    _one_line(e, str(no_weights_dir))
    llama = tmp_path / "llama"
    shutil.copytree(gpt2, llama)
    raw = json.loads((llama / "config.json").read_text()) | {"model_type": "llama"}
    (llama / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="model_type 'llama' is not supported") as e:
        pretrained.load_pretrained(str(llama))
    _one_line(e, str(llama))
    scaled = tmp_path / "rope_scaled"
    shutil.copytree(neox, scaled)
    raw = json.loads((scaled / "config.json").read_text())
    raw["rope_parameters"] = {**raw.get("rope_parameters", {}), "rope_type": "linear"}
    (scaled / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="rope_type='linear' is not supported") as e:
        pretrained.load_pretrained(str(scaled))
    _one_line(e, str(scaled))
    with pytest.raises(ValueError, match="not a directory") as e:
        pretrained.load_pretrained(str(tmp_path / "nowhere"))
    _one_line(e, "nowhere")
    # A weight file cut short (an interrupted download), found from its header or its zip
    # directory. Was: 'SafetensorError: Error while deserializing header' after the data had
    # loaded, naming no file.
    torch = pytest.importorskip("torch")
    cut = tmp_path / "cut"
    shutil.copytree(gpt2, cut)
    binary = tmp_path / "cut_binary"
    binary.mkdir()
    shutil.copy(os.path.join(gpt2, "config.json"), binary)
    torch.save(saved["gpt2"][0].state_dict(), binary / "pytorch_model.bin")
    for path, file in ((cut, "model.safetensors"), (binary, "pytorch_model.bin")):
        os.truncate(path / file, os.path.getsize(path / file) // 2)
        with pytest.raises(ValueError, match=rf"{file} cannot be read \(.*\); is it whole?") as e:
            pretrained.inspect_checkpoint(str(path))
        _one_line(e, str(path))


def test_missing_and_extra_weights_are_refused(saved, tmp_path):
    from safetensors.numpy import load_file, save_file

    gpt2 = saved["gpt2"][1]
    tensors = load_file(os.path.join(gpt2, "model.safetensors"))
    for name, change in (("missing", lambda t: t.pop("transformer.h.1.mlp.c_fc.bias")),
                         ("extra", lambda t: t.__setitem__("transformer.h.0.attn.c_q.weight",
                                                           np.zeros(3, np.float32)))):
        path = tmp_path / name
        shutil.copytree(gpt2, path)
        changed = dict(tensors)
        change(changed)
        save_file(changed, str(path / "model.safetensors"))
        with pytest.raises(ValueError, match="is missing|no place for") as e:
            pretrained.load_pretrained(str(path))
        _one_line(e, str(path))


def test_a_config_that_disagrees_with_its_weights_is_one_line(saved, tmp_path):
    """A config.json whose width is not its weights' names the path and the tensor (was: numpy's
    'cannot reshape array of size 1536 into shape (48,2,24)', naming neither), and one that is
    not a JSON object names the file (was: AttributeError: 'list' object has no attribute
    'get')."""
    for variant, width_key, tensor in (("gpt2", "n_embd", "c_attn.weight"),
                                       ("neox_parallel", "hidden_size", "query_key_value.weight")):
        path = tmp_path / f"{variant}_wider_config"
        shutil.copytree(saved[variant][1], path)
        raw = json.loads((path / "config.json").read_text())
        raw[width_key] += 2 * raw.get("n_head", raw.get("num_attention_heads"))
        (path / "config.json").write_text(json.dumps(raw))
        with pytest.raises(ValueError, match="its config says") as e:
            pretrained.load_pretrained(str(path))
        _one_line(e, str(path), tensor)
    for content in ("[1, 2]", "null"):
        path = tmp_path / f"not_an_object_{content[0]}"
        shutil.copytree(saved["gpt2"][1], path)
        (path / "config.json").write_text(content)
        with pytest.raises(ValueError, match="not an object") as e:
            pretrained.inspect_checkpoint(str(path))
        _one_line(e, str(path / "config.json"))


def _random_model(cfg, seed):
    """Our model with every parameter, biases and LayerNorms too, random and non-zero."""
    params = model.init_params(jax.random.PRNGKey(seed), cfg)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape)
                                        for x, k in zip(leaves, keys, strict=True)])


@pytest.mark.parametrize("options", [dict(),
                                     dict(pos_encoding="rotary", n_heads=2, rotary_base=100),
                                     dict(attn_only=True, n_layers=1, folded=True)])
def test_a_transformer_lens_export_reads_back(tmp_path, options):
    pytest.importorskip("transformer_lens")
    from safetensors.torch import save_file

    from jaxillusions.report import export

    options = dict(options)
    folded = options.pop("folded", False)
    cfg = model.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32, **options)
    params = _random_model(cfg, 3)
    if folded:  # LayerNorms folded away (TransformerLens's LNPre): scale 1, bias 0
        params = jax.tree_util.tree_map_with_path(
            lambda p, x: (jnp.ones_like(x) if model.path_str(p).endswith("scale") else
                          jnp.zeros_like(x)) if "ln" in model.path_str(p) else x, params)
    weights = export.state_dict(params, cfg)
    config = export.tl_config(cfg).to_dict()
    if folded:
        weights = {k: v for k, v in weights.items() if ".ln" not in k and "ln_final" not in k}
        config["normalization_type"] = "LNPre"
    os.makedirs(tmp_path / "tl")
    save_file(weights, str(tmp_path / "tl" / "model.safetensors"))
    (tmp_path / "tl" / "tl_config.json").write_text(json.dumps(config, default=str))
    loaded, imported = pretrained.load_pretrained(str(tmp_path / "tl"))
    loaded = _one(loaded)
    assert imported.key_bias and not np.any(np.asarray(loaded["blocks"][0]["attn"]["b_k"]))
    if cfg.pos_encoding == "rotary":
        assert (imported.rotary_layout, imported.rotary_dims, imported.rotary_base) == (
            "adjacent", cfg.head_dim, 100)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        other = loaded
        for key in keys:
            other = other[key]
        assert np.array_equal(np.asarray(other), np.asarray(leaf)), model.path_str(path)
    tokens = jax.random.randint(jax.random.PRNGKey(5), (4, 12), 0, 11)
    ref = np.asarray(model.forward(params, tokens, cfg)[0], np.float64)
    got = np.asarray(model.forward(loaded, tokens, imported)[0])
    assert np.all(np.abs(got - ref) <= tol.two_ways(tol.activation_error(ref, 32)))


def test_the_circuits_graph_refuses_an_imported_architecture(saved):
    # patching.edge_forward recomputes the trained architecture: no parallel blocks, key bias...
    from jaxillusions.model import patching

    cfg = pretrained.inspect_checkpoint(saved["neox_parallel"][1]).config
    assert model.imported_options(cfg)["parallel_residual"] is True
    with pytest.raises(ValueError, match="imported architecture"):
        patching.graph(cfg)
    assert not model.imported_options(model.ModelConfig(vocab_size=5, max_len=4))
