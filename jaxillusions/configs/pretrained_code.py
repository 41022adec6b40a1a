"""Judge imported pretrained checkpoints on text files: the proxies fitted on the models'
activations on `train` text, their faithfulness on held-out text of the same kind (`iid`), on
other text (`python`, `javascript`) and on longer rows (`longer`). Training is skipped: the
members are the checkpoint directories of model.pretrained (docs/pretrained.md).

A template: its paths are placeholders, here those that `python -m
benchmarks.train_hf_population --out=checkpoints/hf_population` writes (8 GPT-NeoX seeds, their
tokenizer and text). Point them at your own checkpoints, tokenizer and text, in a copy of this
file or on the command line, then

    jaxillusions sweep --config=pretrained_code --workdir=runs/pretrained_code

Until they exist the door refuses the run with a one-line error naming the first missing path
(the test suite runs this setup on files it makes: tests/test_text_task.py).
`--config=pretrained_code:steps` judges the first seed's checkpoints along training instead.

On the 2-core CPU machine (AMD EPYC, `lscpu`: family 26 model 2), alone, with the 8 seeds the
benchmark trained there (19 min 27 s): 23 min 11 s wall, `time 1385 s: training 79 s, collection
41 s, fitting 6 s, evaluation 1254 s, ...` (peak memory 9.3 GB). (On the AMD EPYC of family 25
model 17, before the CPU's cap on each member's logits per call and the scan over its chunks,
docs/speed.md: 45 min 46 s, `evaluation 2548 s`, shared with test runs for its last 15
minutes.) What it showed, the same on both machines to the digits below, 8 seeds,
paired 95% t intervals (docs/pretrained.md, "A population trained with Hugging Face"): no gap
beyond +-0.001 on held-out Python files or longer rows; every proxy less faithful on JavaScript
(SVD rank 8 of the queries +0.005 [+0.003, +0.006], k-means 64 +0.014 [+0.011, +0.017], 8/8
seeds); more faithful on copyable tokens than on first occurrences in distribution (SVD rank 8:
+0.004 [+0.003, +0.005]), with a larger JavaScript gap there (+0.006 against +0.004, intervals
overlapping).

Keys: data.files {split: (paths of .txt or .jsonl files, ...)}, `train` required (the proxies'
fit split; its held-out blocks make `iid` and `longer`), the other names are evaluation splits;
data.tokenizer (a tokenizer.json: the checkpoints'); data.window tokens per row (within the
checkpoints' positions); model.pretrained the checkpoint directories (Hugging Face GPT-2 or
GPT-NeoX, or TransformerLens).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import defaults

POPULATION = "checkpoints/hf_population"  # the placeholder: where the benchmark writes


# A template: its paths are the user's (the door refuses it, naming the first missing one, until
# they exist); the tests that run or check every shipped config leave it out.
TEMPLATE = True


def get_config(arg: str = "seeds") -> ConfigDict:
    config = defaults("text")

    if arg == "seeds":
        # The checkpoints: one member each (seed1 ... seed8 -> seeds 1 ... 8 in results.csv).
        config.model.pretrained = tuple(f"{POPULATION}/seed{s}" for s in range(1, 9))
    elif arg == "steps":
        # One seed along training: its Trainer checkpoints (checkpoint-200 ... checkpoint-800
        # -> members 200 ... 800), judged smaller (the SVD of the queries, 128 rows per split).
        config.model.pretrained = tuple(f"{POPULATION}/seed1/checkpoint-{s}"
                                        for s in (200, 400, 600, 800))
    else:
        raise ValueError(f"--config=pretrained_code:{arg}: the argument must be seeds or steps")

    # The text: train (fit on; a tenth held out as iid, and as longer rows of 256 tokens), and
    # the held-out languages. Drop javascript where npm was missing when the text was made.
    config.data.files = {
        "train": (f"{POPULATION}/text/train.txt",),
        "python": (f"{POPULATION}/text/heldout_python.txt",),
        "javascript": (f"{POPULATION}/text/heldout_javascript.txt",),
    }
    config.data.tokenizer = f"{POPULATION}/tokenizer.json"
    config.data.longer_window = 256  # the models' context is 128 (rotary: any length runs)

    # 256 rows of 128 tokens per split (32k predictions each; the text task's default, 2000,
    # makes each proxy size's evaluation 8x longer on a CPU).
    config.data.max_rows = 256

    # Proxies: the SVD and k-means of the last layer's queries and keys (head dimension 32),
    # fitted on train, judged on the held-out text.
    config.proxies.methods = ("svd", "kmeans")
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k")
    config.proxies.svd_ranks = (4, 8, 16)
    config.proxies.kmeans_sizes = (16, 64)
    config.proxies.eval_splits = ("iid", "python", "javascript", "longer")
    if arg == "steps":
        config.data.max_rows = 128
        config.proxies.methods = ("svd",)
        config.proxies.targets = ("blocks.-1.attn.q",)
    return config
