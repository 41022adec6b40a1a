"""Logit lens, tuned lens, linear probes and concept erasure (LEACE) on the 32-seed Dyck population
(dyck_population.py), judged on every split: docs/lenses.md.

    jaxillusions train --config=dyck_population --workdir=runs/dyck_population
    jaxillusions sweep --config=dyck_lenses --workdir=runs/dyck_population

It shares the population's training keys, so it shares its workdir and trained models (the first
command trains them, or use a workdir the population's main job finished: its reports move to
superseded/). Proxies: the logit lens at every residual site; the tuned lens at every residual
site before the last, corrections of rank 0 (mean shift), 2, 8 and 32 (full); LEACE of depth
(size 0) and of the bracket to close (size 1) at the residual sites and at the last layer's
queries and keys; the probe table (probes.csv, probes.txt) at the same sites.

Time: 2 min 43 s wall for the second command on the trained population, on the 2-core CPU
machine (AMD EPYC, `lscpu` family 25 model 17; alone; compiled programs cached; peak memory 4.9
GB): `time 159 s: training 4 s, collection 11 s, fitting 3 s, evaluation 72 s (14 families on 6
splits), proxies 2 s, probes 51 s, reports 9 s, figures 7 s`. On the AMD EPYC of family 26
model 2, right after the population's main job (its programs cached, not these): 1 min 56 s,
`time 113 s: training 4 s, collection 8 s, fitting 3 s, evaluation 51 s, proxies 1 s, probes
34 s, reports 6 s, figures 6 s; of which compilation 7.7 s (23 XLA programs)`. On the Intel
Xeon of family 6 model 207 (13 of the 23 programs cached): 3 min 0 s, `time 178 s: ...,
evaluation 82 s, ..., probes 54 s, ...`, peak memory 5.1 GB, the findings compared in
docs/lenses.md within 0.012.

What it showed (docs/lenses.md, 32 seeds, paired 95% intervals): the logit lens agrees with the
model on 95.5% of iid closing brackets after layer 0's MLP, but on unseen_depth only at the last
site (0.936 one sublayer earlier), every OOD gap positive at every earlier site (32/32 seeds on
unseen_depth); the closed-form tuned lens beats it only at the embeddings. The depth probe
fitted at training depths falls from 0.673 (iid) to 0.368 on unseen_depth's training depths
(gap +0.306 [+0.300, +0.311], 32/32) though a refitted probe still decodes depth there.
Erasing depth from the last layer's queries changes 1% of iid predictions and 3.6% of
unseen_depth's (gap +0.026 [+0.015, +0.037], 32/32); LEACE fitted on train leaves the bracket
to close decodable 0.13 above chance on held-out training sentences and 0.54 on longer (r0post).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_population

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
    config.probes.sites = (*RESIDUAL, "blocks.-1.attn.q", "blocks.-1.attn.k")
    return config
