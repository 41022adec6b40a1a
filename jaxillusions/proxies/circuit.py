"""Circuit proxy: the model with only a circuit's edges, nodes or neurons kept and every other
one ablated (model/patching.py), the circuit found on the fit split by attribution patching.

A size is how many units the circuit keeps: edges (sender output -> receiver input), nodes
(heads and MLPs) or neurons (heads and MLP neurons), proxies.circuit_granularity. The units of
largest |attribution| summed over the fit split's non-PAD positions (metric
proxies.circuit_metric: KL to the model's output or the logit of its prediction) are kept; the
rest take their ablated value, proxies.circuit_ablation: zero, their mean over the fit split, or
their value on another sentence (resample). proxies.circuit_direction "complement" ablates what
lies outside the circuit (is the circuit sufficient?), "circuit" ablates the circuit itself and
keeps the rest (is it necessary?). One family per (granularity, ablation): its target, the
`site` column of its rows, is "circuit.<granularity>.<ablation>".

The proxy replaces the whole forward pass, not one site (SITE "model", proxies/__init__.py).
It is found on the first proxies.circuit_sentences sentences of the fit split (i.i.d. draws),
in two passes: the units' sums for their means, then the
attribution scores with those means as the ablated values.
"""

import jax
import jax.numpy as jnp

from jaxillusions.model import patching

STATISTIC = "model"
SITE = "model"
SIZES_KEY = "circuit_sizes"
SIZE_LABEL = "units kept"
PASSES = 2


def default_sizes(num: int) -> tuple[int, ...]:
    """0, 1, 2, 4, ... up to `num` units, and `num` itself (the whole model)."""
    powers = [2**i for i in range(num.bit_length()) if 2**i <= num]
    return tuple(sorted({0, *powers, num}))


def families(proxy_cfg, model_cfg) -> list[tuple[str, tuple[int, ...], tuple]]:
    """(target, sizes, fit options) per (granularity, ablation) of the config: sizes
    proxies.circuit_sizes clipped to the granularity's number of units (or default_sizes)."""
    out = []
    for granularity in proxy_cfg.circuit_granularity:
        num = patching.num_units(model_cfg, granularity)
        sizes = tuple(sorted({min(s, num) for s in proxy_cfg.circuit_sizes})) or \
            default_sizes(num)
        for ablation in proxy_cfg.circuit_ablation:
            options = (("granularity", granularity), ("ablation", ablation),
                       ("direction", proxy_cfg.circuit_direction),
                       ("metric", proxy_cfg.circuit_metric),
                       ("sentences", proxy_cfg.circuit_sentences))
            out.append((f"circuit.{granularity}.{ablation}", sizes, options))
    return out


def statistic(pass_index: int, model_params: dict, tokens: jax.Array, valid: jax.Array,
              model_cfg, previous: dict, **options) -> dict:
    """One batch's sums of pass `pass_index`: 0, the units' values (for "mean") and the count
    of valid positions; 1, the attribution scores of every unit ([units])."""
    granularity, ablation = options["granularity"], options["ablation"]
    if pass_index == 0:
        out = {"count": valid.sum().astype(jnp.float32)}
        if ablation == "mean":
            out["sums"] = patching.unit_sums(model_params, tokens, model_cfg, granularity, valid)
        return out
    ablated = patching.ablated_values(model_params, tokens, model_cfg, granularity, ablation,
                                      means=_means(previous))
    return {"scores": patching.attribution(model_params, tokens, model_cfg, granularity,
                                           ablated, valid.astype(jnp.float32),
                                           options["metric"])}


def _means(stats: dict):
    if "sums" not in stats:
        return None
    count = jnp.maximum(stats["count"], 1.0)
    return jax.tree.map(lambda s: s / count, stats["sums"])


def fit(stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None,
        granularity: str = "edge", ablation: str = "mean", direction: str = "complement",
        metric: str = "kl", sentences: int = 0) -> dict:
    """{"mask": [R, units] (1 kept), "scores": [R, units] the attribution scores, "mean": the
    units' means with a leading R axis ("mean" ablation only)}."""
    del key, granularity, metric, sentences  # deterministic; the statistics carry the rest
    mask = patching.select(stats["scores"], sizes)
    if direction == "circuit":
        mask = 1 - mask
    r = len(sizes)
    out = {"mask": mask, "scores": jnp.broadcast_to(stats["scores"], mask.shape)}
    if ablation == "mean":
        out["mean"] = jax.tree.map(lambda m: jnp.broadcast_to(m, (r, *m.shape)), _means(stats))
    return out


def logits(params: dict, model_params: dict, tokens: jax.Array, model_cfg, **options
           ) -> jax.Array:
    """One size's circuit on `tokens` [batch, pos] -> logits [batch, pos, vocab]."""
    granularity = options["granularity"]
    ablated = patching.ablated_values(model_params, tokens, model_cfg, granularity,
                                      options["ablation"], means=params.get("mean"))
    return patching.masked_logits(model_params, tokens, model_cfg, granularity,
                                  params["mask"], ablated)
