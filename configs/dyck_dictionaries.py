"""Sparse dictionaries on the 32-seed population: SAEs and transcoders beside Friedman et al.'s
proxies, per generalization split (docs/sparse_dictionaries.md).

    python -m launch.train --config=configs/dyck_population.py --workdir=runs/dyck_population
    python -m launch.sweep --config=configs/dyck_dictionaries.py --workdir=runs/dyck_population

The training keys are configs/dyck_population.py's, so this config shares its workdir: proxies.*
are analysis keys, and a relaunch with other proxies keeps the trained models (and, stage by stage,
every proxy family whose settings did not change). The population run's SVD on the last layer's
queries, keys and both (ranks 1..32), the low-rank reference, plus
- `sae` on the last layer's queries and keys (d_head 32) and on blocks.0/1.resid_mid
  (d_model 32), widths 32, 64, 128 (1x to 4x the dimension) x k 4 and 8 (6 sizes, coded
  k * 100000 + width);
- `transcoder` on each MLP (blocks.0.mlp.out, blocks.1.mlp.out), the same widths and ks;
- 200 Adam steps of 128 vectors at learning rate 3e-3 on the 20,000 training vectors per seed,
  a budget set by the time below (all 6 sizes, 32 seeds and 1 head padded to width 128 run in
  one program per site).

Time: MEASURED below.
"""

from ml_collections import ConfigDict

from configs import dyck_population


def get_config() -> ConfigDict:
    config = dyck_population.get_config()
    pc = config.proxies
    # SVD (first, as in the population run: its fitted and evaluated stages are reused) as the
    # low-rank reference; k-means and hard attention stay in configs/dyck_population.py.
    pc.methods = ("svd", "sae", "transcoder")
    pc.sae_targets = ("blocks.-1.attn.q", "blocks.-1.attn.k", "blocks.0.resid_mid",
                      "blocks.1.resid_mid")
    pc.transcoder_targets = ("blocks.0.mlp.out", "blocks.1.mlp.out")
    pc.sae_sizes = (32, 64, 128)
    pc.transcoder_sizes = (32, 64, 128)
    pc.sae_k = (4, 8)
    pc.sae_steps = 200
    pc.sae_batch = 128
    pc.sae_lr = 3e-3
    return config
