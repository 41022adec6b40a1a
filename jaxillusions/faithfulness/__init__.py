"""Fit simplified proxies of trained models and measure how faithfully they reproduce them.

The three steps, each batched over the leading seed axis of `params`:

    stats  = collect(params, splits["train"], model_cfg, specs)       # training split only
    fitted = fit(specs, stats, key)                                   # one entry per spec
    rows   = evaluate(params, model_cfg, splits, fitted)              # tidy dict rows

A `ProxySpec` names a proxy module (jaxillusions/proxies/NAME.py), the sites it replaces (several
sites are simplified together, each with its own proxy) and the sizes (ranks, cluster counts) that
are fitted and evaluated together in one batched call.

The modules (each imports from the ones listed before it only, and from the metric modules):

    specs.py               ProxySpec, the specs a config asks for, the sites they name
    collect.py             collect: the training split's statistics; the seed chunks (Chunking)
    fit.py                 fit, fit_one -> FittedProxy; make_intervention
    evaluate.py            make_eval_set -> EvalSet; evaluate -> rows
    metrics.py             the per-position metrics (jsd, same_pred, correct)
    dictionary_metrics.py  the dictionary metrics of vector proxies (fvu, l0, dead, ce/kl_score)
"""
