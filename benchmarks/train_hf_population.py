"""A population that no code of ours trained: N small GPT-NeoX models trained with Hugging Face's
own `Trainer` (GPTNeoXConfig / GPTNeoXForCausalLM, random initialisation), differing only in the
seed, on Python functions of this interpreter's standard library; for the judge to load with
`jaxillusions.model.pretrained.load_pretrained` (docs/pretrained.md, "A population trained with
Hugging Face").

    python -m benchmarks.train_hf_population --out=checkpoints/hf_population   # 8 seeds
    python -m benchmarks.train_hf_population --out=/tmp/hf_tiny --seeds=2 --tiny  # the test's

What it writes under --out:
- `seed<s>/` for each seed s (1..N, or the list given): `config.json` and `model.safetensors`
  (`Trainer.save_model`, i.e. `save_pretrained`), `tokenizer.json` and `tokenizer_config.json`
  (the tokenizer below, as a `PreTrainedTokenizerFast`), `training_args.bin`, and
  `train_log.json` (the loss every --log_steps steps, seconds, steps per second).
- `seed<c>/checkpoint-<step>/` for one seed c (--checkpoint_seed, default the first): the
  Trainer's checkpoints every --save_steps steps and at the last step (`save_only_model`: config,
  weights and tokenizer, no optimizer state); each loads with `load_pretrained` as it is
  (`member_labels` calls them by their step: `4`, `8`, ...; pass {f"step{n}": path} for names).
- `tokenizer.json`: a byte-level BPE tokenizer (`tokenizers`, --vocab_size entries) trained here
  on the training text; id 0 is `<|pad|>`, which no text contains (the project treats token 0 as
  padding), id 1 `<|endoftext|>`, the separator between functions.
- `text/train.txt`: the training text; `text/heldout_python.txt`: the functions of the held-out
  standard-library files (none of their functions is in train.txt); `text/heldout_javascript.txt`:
  the JavaScript functions shipped with npm, where npm is installed (`splits.find_npm`, as the
  code task's other_language split), else absent (data.json says why). Functions are cut out
  as the code task does (`tasks.code_completion.corpus.read_files`: functions not nested in
  another function, dedented; test suites and files skipped), exact duplicates dropped (the
  first kept), and joined with `<|endoftext|>`; the tokenizer reads that as its special token,
  so `tokenizer.encode(text)` of a file gives the stream that training cut into windows.
- `data.json`: the held-out files, counts of functions, characters, tokens and windows.

Data: the standard library's files are shuffled by --data_seed (the same for every model seed)
and --heldout_fraction of them held out. The training text is tokenized as one stream and cut
into windows of --context tokens (the remainder dropped); every seed sees the same windows.

What differs between seeds: `TrainingArguments(seed=s, full_determinism=True)` seeds Python,
numpy and torch before `model_init` builds the model (the initialisation) and seeds the order in
which the Trainer's sampler draws the windows, as PolyPythias' seeds change both. With
`full_determinism` (torch.use_deterministic_algorithms) a seed trained twice on the same
machine, torch build and thread count gives bit-identical weights (tests/test_hf_population.py).

Model (the defaults): GPT-NeoX with Pythia's layout (parallel attention and MLP, rotary
positions on a quarter of each head, untied unembedding, exact GELU, no dropout), 4 layers,
d_model 128, 4 heads, MLP 512, context 128, vocabulary 4096; AdamW (beta2 0.95), learning rate
1e-3 with 80 warmup steps and cosine decay, weight decay 0.01, gradient clipping at 1, batch 16
windows (2048 tokens), 800 steps: 1.6M tokens, 0.78 epochs of the training text (2.09M tokens in
16314 windows).

Time, measured on the 2-core CPU machine (lscpu: "AMD EPYC"), torch 2.13.0+cpu, transformers
5.24.0, shared with other work (load average 0.5 when each run began): 2 seeds x 40
steps of the default model ran at 4.56 and 4.59 steps/s in one run, 5.56 and 5.38 in another
(Trainer setup and the checkpoints included; about 0.2 s per step); data and tokenizer took
13.7 s. At the slower rate the default population, 8 seeds x 800 steps, takes 8 x 800 / 4.56 =
1404 s, about 23.5 minutes with the preparation (19.5 minutes at the faster rate): under 30.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The default population's sizes (docstring: time).
# (String keys: each is a command-line flag of the same name.)
DEFAULTS = {"steps": 800, "layers": 4, "d_model": 128, "heads": 4, "d_mlp": 512, "context": 128,
            "vocab_size": 4096, "batch_size": 16, "lr": 1e-3, "warmup": 80,
            "weight_decay": 0.01}
# --tiny: the test's size (tests/test_hf_population.py), seconds per seed.
TINY = {"steps": 10, "layers": 2, "d_model": 32, "heads": 2, "d_mlp": 64, "context": 32,
        "vocab_size": 512, "batch_size": 4, "lr": 1e-3, "warmup": 2, "weight_decay": 0.01}
PAD, EOS = "<|pad|>", "<|endoftext|>"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--seeds", default="8",
                   help="a count N (seeds 1..N) or a comma-separated list of seeds")
    p.add_argument("--tiny", action="store_true",
                   help="the test's tiny model and data (sizes below still override it)")
    for key, value in DEFAULTS.items():
        p.add_argument(f"--{key}", type=type(value), default=None,
                       help=f"default {value} ({TINY[key]} with --tiny)")
    p.add_argument("--save_steps", type=int, default=None,
                   help="checkpoint-<step> of the checkpoint seed every this many steps "
                        "(default: a quarter of --steps; 0: none)")
    p.add_argument("--checkpoint_seed", type=int, default=None,
                   help="the seed that leaves checkpoints (default: the first)")
    p.add_argument("--log_steps", type=int, default=50, help="loss logged every this many steps")
    p.add_argument("--data_seed", type=int, default=0, help="which files are held out")
    p.add_argument("--heldout_fraction", type=float, default=0.1,
                   help="fraction of the standard library's files held out")
    p.add_argument("--max_train_chars", type=int, default=0,
                   help="training text cut to its first functions up to this many characters "
                        "(0: all; --tiny: 200000)")
    p.add_argument("--no_javascript", action="store_true",
                   help="do not write held-out JavaScript even where npm is installed")
    return p


def seed_list(spec: str) -> list[int]:
    parts = [int(s) for s in spec.split(",") if s.strip()]
    if len(parts) == 1 and "," not in spec:
        return list(range(1, parts[0] + 1))
    return parts


# ---------------------------------------------------------------------------------------------
# Data.


def _dedup(records, seen: set) -> list[str]:
    out = []
    for r in records:
        if r.code not in seen:
            seen.add(r.code)
            out.append(r.code)
    return out


def prepare_text(out: str, *, data_seed: int, heldout_fraction: float, max_train_chars: int,
                 javascript: bool, say=print) -> dict:
    """Writes out/text/{train,heldout_python,heldout_javascript}.txt; returns data.json's
    dict."""
    import numpy as np

    from jaxillusions.tasks.code_completion import corpus, splits

    root = corpus.stdlib_root()
    records, stats = corpus.read_files(root, "python", True, "stdlib")
    files = sorted({r.path for r in records})
    rng = np.random.default_rng([data_seed, 0])
    held = {files[i] for i in rng.permutation(len(files))[:max(1, round(heldout_fraction
                                                                        * len(files)))]}
    seen: set = set()
    train = _dedup([r for r in records if r.path not in held], seen)
    if max_train_chars:
        total, kept = 0, []
        for code in train:
            if total + len(code) > max_train_chars and kept:
                break
            kept.append(code)
            total += len(code)
        train = kept
    heldout = _dedup([r for r in records if r.path in held], seen)  # none that train has
    texts = {"train": train, "heldout_python": heldout}
    info = {"stdlib": root, "stdlib_files": stats["files"], "files_with_functions": len(files),
            "heldout_files": sorted(held), "data_seed": data_seed,
            "heldout_fraction": heldout_fraction}
    npm = splits.find_npm() if javascript else None
    if npm:
        js, js_stats = corpus.read_files(npm, "javascript", True, "npm")
        texts["heldout_javascript"] = _dedup(js, set())
        info["javascript"] = {"source": npm, **js_stats}
    else:
        info["javascript"] = ("skipped: --no_javascript" if not javascript else
                              "skipped: no npm JavaScript on this machine (splits.find_npm)")
    os.makedirs(os.path.join(out, "text"), exist_ok=True)
    for name, functions in texts.items():
        with open(os.path.join(out, "text", f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write(EOS.join(functions))
        info[name] = {"functions": len(functions), "chars": sum(map(len, functions))}
    say(f"data: {info['train']['functions']} training functions ({info['train']['chars']:,} "
        f"characters) from {len(files) - len(held)} files; held out {len(held)} files "
        f"({info['heldout_python']['functions']} functions); JavaScript: "
        + (f"{info['heldout_javascript']['functions']} functions from {npm}" if npm
           else info["javascript"]))
    return info


def train_tokenizer(text_file: str, vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer and decoder) trained on `text_file`;
    ids 0 and 1 are PAD and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([text_file], trainer)
    assert tok.token_to_id(PAD) == 0 and tok.token_to_id(EOS) == 1
    return tok


def windows(tok, text_file: str, context: int):
    """The file's tokens as one stream, cut into [n, context] int64 windows."""
    import numpy as np

    with open(text_file, encoding="utf-8") as f:
        ids = np.asarray(tok.encode(f.read()).ids, np.int64)
    n = len(ids) // context
    return ids[: n * context].reshape(n, context), len(ids)


# ---------------------------------------------------------------------------------------------
# Training.


class _Windows:
    """A torch-style dataset of fixed windows: input_ids and labels (the model shifts them)."""

    def __init__(self, array):
        import torch

        self.data = torch.from_numpy(array)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def model_config(sizes: dict, vocab_size: int):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=vocab_size, hidden_size=sizes["d_model"], num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"], intermediate_size=sizes["d_mlp"],
        max_position_embeddings=sizes["context"], rotary_pct=0.25, rotary_emb_base=10_000,
        use_parallel_residual=True, hidden_act="gelu", attention_dropout=0.0,
        hidden_dropout=0.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=1,
        pad_token_id=0, initializer_range=0.02)


def train_seed(seed: int, out_dir: str, config, dataset, tokenizer, sizes: dict, *,
               save_steps: int, log_steps: int) -> dict:
    """One seed with transformers.Trainer; the model in out_dir (save_pretrained)."""
    from transformers import GPTNeoXForCausalLM, Trainer, TrainerCallback, TrainingArguments

    args = TrainingArguments(
        output_dir=out_dir, seed=seed, full_determinism=True, use_cpu=True,
        max_steps=sizes["steps"], per_device_train_batch_size=sizes["batch_size"],
        learning_rate=sizes["lr"], warmup_steps=sizes["warmup"], lr_scheduler_type="cosine",
        weight_decay=sizes["weight_decay"], adam_beta2=0.95, max_grad_norm=1.0,
        optim="adamw_torch", logging_steps=log_steps, report_to="none", disable_tqdm=True,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or sizes["steps"],
        save_only_model=True, dataloader_num_workers=0, dataloader_drop_last=True)
    log: list[dict] = []

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                log.append({"step": state.global_step, "loss": float(logs["loss"])})

    trainer = Trainer(model_init=lambda: GPTNeoXForCausalLM(config), args=args,
                      train_dataset=dataset, processing_class=tokenizer, callbacks=[Keep()])
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(out_dir)
    summary = {"seed": seed, "steps": sizes["steps"], "seconds": seconds,
               "steps_per_s": sizes["steps"] / seconds, "train_loss": result.training_loss,
               "log": log}
    with open(os.path.join(out_dir, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    sizes = {k: getattr(args, k) if getattr(args, k) is not None else (TINY if args.tiny
                                                                       else DEFAULTS)[k]
             for k in DEFAULTS}
    seeds = seed_list(args.seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        sys.exit(f"error: --seeds={args.seeds}: expected a count or distinct seeds")
    save_steps = sizes["steps"] // 4 if args.save_steps is None else args.save_steps
    checkpoint_seed = seeds[0] if args.checkpoint_seed is None else args.checkpoint_seed
    max_chars = args.max_train_chars or (200_000 if args.tiny else 0)
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    from jaxillusions.runtime.machine import cpu_model

    hf_logging.disable_progress_bar()

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    info = prepare_text(out, data_seed=args.data_seed, heldout_fraction=args.heldout_fraction,
                        max_train_chars=max_chars, javascript=not args.no_javascript)
    train_file = os.path.join(out, "text", "train.txt")
    tok = train_tokenizer(train_file, sizes["vocab_size"])
    tok.save(os.path.join(out, "tokenizer.json"))
    data, num_tokens = windows(tok, train_file, sizes["context"])
    info |= {"tokens": num_tokens, "windows": int(len(data)), "context": sizes["context"],
             "vocab_size": tok.get_vocab_size(), "prepare_s": time.perf_counter() - start}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                        bos_token=EOS, unk_token=None)
    config = model_config(sizes, tok.get_vocab_size())
    print(f"tokens: {num_tokens:,} in {len(data)} windows of {sizes['context']}; "
          f"{sizes['steps']} steps x {sizes['batch_size']} windows = "
          f"{sizes['steps'] * sizes['batch_size'] / len(data):.2f} epochs; "
          f"prepared in {info['prepare_s']:.1f} s", flush=True)
    dataset = _Windows(data)
    runs = []
    for seed in seeds:
        run = train_seed(seed, os.path.join(out, f"seed{seed}"), config, dataset, tokenizer,
                         sizes, save_steps=save_steps if seed == checkpoint_seed else 0,
                         log_steps=args.log_steps)
        runs.append({k: v for k, v in run.items() if k != "log"})
        print(f"seed {seed}: {sizes['steps']} steps in {run['seconds']:.1f} s "
              f"({run['steps_per_s']:.2f} steps/s), loss {run['train_loss']:.3f}", flush=True)
    report = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "sizes": sizes,
              "seeds": seeds, "checkpoint_seed": checkpoint_seed, "save_steps": save_steps,
              "data": info, "runs": runs, "seconds": time.perf_counter() - start}
    with open(os.path.join(out, "data.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {len(seeds)} model(s) under {out} in {report['seconds']:.0f} s "
          f"(CPU: {report['cpu_model']}, {os.cpu_count()} cores)")
    return report


if __name__ == "__main__":
    main()
