"""Judge imported pretrained checkpoints on text files: the proxies fitted on the models'
activations on `train` text, their faithfulness on held-out text of the same kind (`iid`), on
other text (`python`, `javascript`) and on longer rows (`longer`). Training is skipped: the
members are the checkpoint directories of model.pretrained (docs/pretrained.md).

A template: its paths are placeholders, here those that `python -m
benchmarks.train_hf_population --out=checkpoints/hf_population` writes (8 GPT-NeoX seeds, their
tokenizer and text). Point them at your own checkpoints, tokenizer and text, in a copy of this
file or on the command line, then

    jaxillusions sweep --config=pretrained_text --workdir=runs/pretrained_text

Until they exist the door refuses the run with a one-line error naming the first missing path
(the test suite runs this setup on files it makes: tests/test_text_task.py).

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


def get_config() -> ConfigDict:
    config = defaults("text")

    # The checkpoints: one member each (seed1 ... seed8 -> seeds 1 ... 8 in results.csv).
    config.model.pretrained = tuple(f"{POPULATION}/seed{s}" for s in range(1, 9))

    # The text: train (fit on; a tenth held out as iid, and as longer rows of 256 tokens), and
    # the held-out languages. Drop javascript where npm was missing when the text was made.
    config.data.files = {
        "train": (f"{POPULATION}/text/train.txt",),
        "python": (f"{POPULATION}/text/heldout_python.txt",),
        "javascript": (f"{POPULATION}/text/heldout_javascript.txt",),
    }
    config.data.tokenizer = f"{POPULATION}/tokenizer.json"
    config.data.longer_window = 256  # the models' context is 128 (rotary: any length runs)

    # Proxies: the default methods and targets (the last layer's queries and keys), judged on
    # the held-out text.
    config.proxies.eval_splits = ("iid", "python", "javascript", "longer")
    return config
