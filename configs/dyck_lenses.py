"""Logit lens, tuned lens, linear probes and concept erasure (LEACE) on the 32-seed Dyck population
(configs/dyck_population.py), judged on every split: docs/lenses.md.

    python -m launch.train --config=configs/dyck_population.py --workdir=runs/dyck_population
    python -m launch.sweep --config=configs/dyck_lenses.py --workdir=runs/dyck_population

It shares the population's training keys, so it shares its workdir and trained models (the first
command trains them, or use a workdir the population's main job finished: its reports move to
superseded/). Proxies: the logit lens at every residual site; the tuned lens at every residual
site before the last, corrections of rank 0 (mean shift), 2, 8 and 32 (full); LEACE of depth
(size 0) and of the bracket to close (size 1) at the residual sites and at the last layer's
queries and keys; the probe table (probes.csv, probes.txt) at the same sites.

Time: TODO

What it showed: TODO
"""

from ml_collections import ConfigDict

from configs import dyck_population

RESIDUAL = ("blocks.0.resid_pre", "blocks.0.resid_mid", "blocks.0.resid_post",
            "blocks.1.resid_mid", "blocks.1.resid_post")


def get_config() -> ConfigDict:
    config = dyck_population.get_config()
    pc = config.proxies
    pc.methods = ("logit_lens", "tuned_lens", "erasure")
    pc.logit_lens_targets = RESIDUAL
    pc.tuned_lens_targets = RESIDUAL[:-1]  # at the last site the tuned lens is the identity
    pc.tuned_lens_ranks = (0, 2, 8, 32)
    pc.concepts = ("depth", "bracket")  # erasure's sizes 0 and 1
    pc.erasure_targets = (*RESIDUAL[1:-1], "blocks.-1.attn.q", "blocks.-1.attn.k")
    pc.probe_sites = (*RESIDUAL, "blocks.-1.attn.q", "blocks.-1.attn.k")
    return config
