"""Sparse dictionaries on the 32-seed population: SAEs and transcoders beside Friedman et al.'s
proxies, per generalization split (docs/sparse_dictionaries.md).

    jaxillusions train --config=dyck_population --workdir=runs/dyck_population
    jaxillusions sweep --config=dyck_dictionaries --workdir=runs/dyck_population

The training keys are dyck_population.py's, so this config shares its workdir: proxies.*
are analysis keys, and a relaunch with other proxies keeps the trained models (and, stage by stage,
every proxy family whose settings did not change). The population run's SVD on the last layer's
queries and keys (ranks 1..32), the low-rank reference, plus
- `sae` on the last layer's queries and keys (d_head 32) and on blocks.0/1.resid_mid
  (d_model 32), widths 32, 64, 128 (1x to 4x the dimension) x k 4 and 8 (6 sizes, coded
  k * 100000 + width);
- `transcoder` on each MLP (blocks.0.mlp.out, blocks.1.mlp.out), the same widths and ks;
- 200 Adam steps of 128 vectors at learning rate 3e-3 on the 20,000 training vectors per seed,
  a budget set by the time below (all 6 sizes, 32 seeds and 1 head padded to width 128 run in
  one program per site).

Time, alone on the 2-core CPU machine (AMD EPYC of family 25 model 17, no GPU): the relaunch
on the trained runs/dyck_population took 5 min 30 s, peak memory 2.5 GB: `time 328 s: training
3 s, collection 7 s, fitting 53 s, evaluation 216 s, ...; of which compilation 10.3 s (34 XLA
programs, 13 read from the cache)`; fitting is 32 seeds x 6 sizes in one program per site,
evaluation the 6 new families (SVD's are reused), training the models' restoring. On the Intel
Xeon of family 6 model 207: 7 min 50 s, `time 468 s: ..., fitting 84 s, evaluation 305 s, ...`,
peak memory 2.6 GB, the findings compared in docs/sparse_dictionaries.md within 0.002.

What it showed (32 seeds; docs/sparse_dictionaries.md, "Findings on 32 seeds"): every SAE and
transcoder is less faithful on unseen_structure, unseen_depth and longer, with paired intervals
excluding 0 (e.g. the SAE on the keys, w64k8: same_pred gap +0.006 [+0.004, +0.009] on
unseen_depth, 32/32 seeds), and reconstructs worse on every OOD split (fvu gap > 0 in 30-32 of 32
seeds for every dictionary). At about SVD rank 8's in-distribution same_pred (0.998 on keys) no SAE
has a smaller gap, though it reconstructs the keys twice as well (fvu 0.041 vs 0.087). The
transcoder of the last MLP loses the most out of distribution (kl_score gap +0.160 [+0.136, +0.184]
on unseen_depth, w64k8). k 8 beats k 4 at every width; at 200 steps width 128 is undertrained (up
to 32% dead latents at k 4). ce_score swings on query/key sites (zeroing them barely changes the
loss: a small denominator); read kl_score.
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_population


def get_config() -> ConfigDict:
    config = dyck_population.get_config()
    pc = config.proxies
    # SVD (first, as in the population run: its fitted and evaluated stages are reused) as the
    # low-rank reference; k-means and hard attention stay in dyck_population.py.
    pc.methods = ("svd", "sae", "transcoder")
    pc.sae_targets = ("blocks.-1.attn.q", "blocks.-1.attn.k", "blocks.0.resid_mid",
                      "blocks.1.resid_mid")
    pc.transcoder_targets = ("blocks.0.mlp.out", "blocks.1.mlp.out")
    pc.transcoder_sizes = (32, 64, 128)  # the SAE's widths (its default sae_sizes)
    pc.sae_k = (4, 8)
    pc.sae_steps = 200
    pc.sae_batch = 128
    pc.sae_lr = 3e-3
    return config
