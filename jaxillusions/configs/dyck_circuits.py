"""Circuits as proxies on the 32-seed Dyck population (dyck_population.py): circuits of
edges, nodes and neurons found on the training split by attribution patching, the rest ablated
by zero, mean or resample, judged on every split: docs/circuits.md.

    jaxillusions sweep --config=dyck_population --workdir=runs/dyck_population
    jaxillusions sweep --config=dyck_circuits --workdir=runs/dyck_population

It shares the population's training keys, so it shares its workdir and trained models (the first
command trains them, or use a copy of a workdir the population's main job finished); the
population's proxy families (SVD and k-means of the last layer's queries and keys, one-hot and
uniform attention) are reused from their stage files, not recomputed, and the circuits are
added beside them. Proxies added: the circuit proxy, granularities edge (23 edges of the
2-layer 1-head model), node (4: two heads, two MLPs) and neuron (130: two heads, 128 MLP
neurons), each with ablation zero, mean and resample, sizes 0, 1, 2, 4, ... up to every unit,
found by attribution patching of the KL to the model's output on the first 2000 training
sentences. The overlap of the circuits found on unseen_depth with those found on train:

    python -m benchmarks.circuit_overlap runs/dyck_population unseen_depth

(--config.fit_shift.splits='("train","unseen_depth")' gets it from the main job, with every
proxy's fit-shift rows, at the price of evaluating all 15 families again.)

Time, alone on the 2-core CPU machine (AMD EPYC of family 25 model 17, no GPU): 6 min 43 s for
the second command on the trained population (2 min 15 s for the first), peak memory 5.6 GB:
`time 402 s: training 3 s, collection 110 s, fitting 2 s, evaluation 223 s, ...; of which
compilation 28.3 s`, the collection being the search for the 9 circuit families and the
evaluation their 63 sizes on 6 splits; circuit_overlap took 52 s more. On the Intel Xeon of
family 6 model 207: 9 min 56 s, `time 595 s: ..., collection 160 s, ..., evaluation 327 s, ...,
circuits 36 s, ...`, peak memory 5.7 GB, the findings compared in docs/circuits.md within 0.006;
a relaunch that refitted its proxies at the current code, figures off: `time 601 s: ...,
collection 148 s, ..., evaluation 362 s, proxies 13 s, circuits 8 s, reports 53 s, ...`; a
relaunch that only rewrote the reports at today's code, `time 33 s: ..., reports 19 s, ...`. On
the AMD EPYC of family 26 model 2, figures off: 4 min 24 s, `time 263 s: ..., collection 74 s,
..., evaluation 171 s, ...`; circuit_overlap 23 s.

What it showed (docs/circuits.md, 32 seeds, paired 95% intervals): circuits found on train lose
faithfulness out of distribution: 16 of 23 edges (mean ablation) agree with the model on 0.965
of iid closing brackets, and less on unseen_depth by +0.047 [+0.028, +0.066] (32/32 seeds); the
area under faithfulness against size (CPR) falls by +0.071 [+0.063, +0.078] there. Resample
ablation reverses the small circuits' gaps (nodes' CPR gap -0.027 [-0.034, -0.019]). At equal
iid faithfulness, 128-neuron circuits lose no more than SVD rank 8 of the keys (not detected)
and less than k-means k = 8 (-0.014 [-0.022, -0.006], mean ablation). The 8-edge circuit found
on unseen_depth overlaps train's by Jaccard 0.64 [0.60, 0.69], less than two seeds' train
circuits overlap (0.80 [0.78, 0.83]).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_population


def get_config() -> ConfigDict:
    config = dyck_population.get_config()
    pc = config.proxies
    pc.methods = (*pc.methods, "circuit")
    pc.circuit_granularity = ("edge", "node", "neuron")
    pc.circuit_ablation = ("zero", "mean", "resample")
    return config
