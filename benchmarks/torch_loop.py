"""The same model and optimizer in PyTorch, trained one seed after another: the baseline a
researcher would write first (`python -m launch.benchmark` times it when torch is installed).

Same architecture as jaxillusions.model.forward for the standard model (pre-LN blocks, learned
token and position embeddings, one bias-free key projection, tanh GELU, final layer norm,
unembedding with bias), the same initial scales, and the same optimizer as objective.make_optimizer
(global-norm clipping, then AdamW with b1=0.9, b2=0.98, linear warmup and cosine decay to 10%).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, d: int, h: int, e: int, f: int, n_layers: int):
        super().__init__()
        out = 1.0 / math.sqrt(2 * n_layers)
        self.h, self.e = h, e
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.q, self.v = nn.Linear(d, h * e), nn.Linear(d, h * e)
        self.k = nn.Linear(d, h * e, bias=False)
        self.o = nn.Linear(h * e, d)
        self.mlp_in, self.mlp_out = nn.Linear(d, f), nn.Linear(f, d)
        for lin, scale in ((self.q, d**-0.5), (self.k, d**-0.5), (self.v, d**-0.5),
                           (self.o, (h * e) ** -0.5 * out), (self.mlp_in, d**-0.5),
                           (self.mlp_out, f**-0.5 * out)):
            nn.init.normal_(lin.weight, std=scale)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        y = self.ln1(x)
        q, k, v = (p(y).view(b, t, self.h, self.e).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.e)
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = (pattern @ v).transpose(1, 2).reshape(b, t, self.h * self.e)
        x = x + self.o(z)
        return x + self.mlp_out(nn.functional.gelu(self.mlp_in(self.ln2(x)), approximate="tanh"))


class Transformer(nn.Module):
    def __init__(self, model_cfg):
        super().__init__()
        c = model_cfg
        if (c.front, c.embedding, c.pos_encoding, c.attn_only,
                c.interventions) != (None, "learned", "learned", False, ()):
            raise ValueError("the PyTorch baseline implements the standard model only (learned "
                             "embeddings and positions, MLP blocks, no frozen attention)")
        d = c.d_model
        self.embed = nn.Parameter(torch.randn(c.vocab_size, d) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(c.max_len, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, c.n_heads, c.head_dim, c.d_mlp, c.n_layers)
                                    for _ in range(c.n_layers))
        self.ln_final = nn.LayerNorm(d, eps=1e-5)
        self.unembed = nn.Linear(d, c.vocab_size)
        nn.init.normal_(self.unembed.weight, std=d**-0.5)
        nn.init.zeros_(self.unembed.bias)

    def forward(self, tokens: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        t, device = tokens.shape[1], tokens.device
        steps = torch.arange(t, device=device)
        positions = steps if offset is None else offset[:, None] + steps
        x = self.embed[tokens] + self.pos_embed[positions]
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        for block in self.blocks:
            x = block(x, causal)
        return self.unembed(self.ln_final(x))


def load_jax_params(model: Transformer, params: dict) -> Transformer:
    """Copies one JAX model's parameters (model.init_params layout) into `model` (tests check
    that both compute the same logits)."""
    def t(x):
        return torch.from_numpy(np.array(x, np.float32))

    with torch.no_grad():
        model.embed.copy_(t(params["embed"]))
        model.pos_embed.copy_(t(params["pos_embed"]))
        for block, p in zip(model.blocks, params["blocks"], strict=True):
            a, m = p["attn"], p["mlp"]
            for lin, w in ((block.q, a["w_q"]), (block.k, a["w_k"]), (block.v, a["w_v"])):
                lin.weight.copy_(t(w).flatten(1).T)
            block.q.bias.copy_(t(a["b_q"]).flatten())
            block.v.bias.copy_(t(a["b_v"]).flatten())
            block.o.weight.copy_(t(a["w_o"]).flatten(0, 1).T)
            block.o.bias.copy_(t(a["b_o"]))
            block.mlp_in.weight.copy_(t(m["w_in"]).T)
            block.mlp_in.bias.copy_(t(m["b_in"]))
            block.mlp_out.weight.copy_(t(m["w_out"]).T)
            block.mlp_out.bias.copy_(t(m["b_out"]))
            for ln, q in ((block.ln1, p["ln1"]), (block.ln2, p["ln2"])):
                ln.weight.copy_(t(q["scale"]))
                ln.bias.copy_(t(q["bias"]))
        model.ln_final.weight.copy_(t(params["ln_final"]["scale"]))
        model.ln_final.bias.copy_(t(params["ln_final"]["bias"]))
        model.unembed.weight.copy_(t(params["unembed"]["w"]).T)
        model.unembed.bias.copy_(t(params["unembed"]["b"]))
    return model


def _schedule(train_cfg):
    warmup, num_steps = train_cfg.warmup_steps, train_cfg.num_steps
    # objective.learning_rate_schedule: the cosine over every step after the warmup, or over the
    # last train.decay_steps with the peak rate held before them.
    start = num_steps - train_cfg.decay_steps if train_cfg.decay_steps else warmup
    decay = train_cfg.decay_steps or max(num_steps, warmup + 1) - warmup

    def factor(step: int) -> float:  # relative to the peak
        if step < warmup:
            return step / warmup
        frac = min(max(step - start, 0), decay) / decay
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    return factor


def device() -> torch.device:
    """Where the loop runs: the GPU when torch sees one (as a researcher's script would), else
    the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_seed(seed: int, train_tokens: np.ndarray, model_cfg, train_cfg, num_steps: int,
               max_position_offset: int = 0) -> float:
    """Builds one model and trains it for `num_steps` steps on random batches; returns the last
    loss. Next-token loss over non-PAD targets (PAD = 0); each sentence starts at a random
    position in [0, max_position_offset] (objective.Objective.max_position_offset)."""
    torch.manual_seed(seed)
    dev = device()
    model = Transformer(model_cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=train_cfg.learning_rate, betas=(0.9, 0.98),
                            eps=1e-8, weight_decay=train_cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(train_cfg))
    data = torch.from_numpy(np.asarray(train_tokens, np.int64)).to(dev)
    gen = torch.Generator(dev).manual_seed(seed)
    for _ in range(num_steps):
        batch = data[torch.randint(len(data), (train_cfg.batch_size,), generator=gen, device=dev)]
        offset = (torch.randint(max_position_offset + 1, (len(batch),), generator=gen,
                                device=dev) if max_position_offset else None)
        logits = model(batch[:, :-1], offset)
        targets = batch[:, 1:]
        nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          targets.reshape(-1), reduction="none")
        mask = (targets.reshape(-1) != 0).float()
        loss = (nll * mask).sum() / mask.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        opt.step()
        sched.step()
    return float(loss.detach())


def train_seeds(num_seeds: int, train_tokens: np.ndarray, model_cfg, train_cfg, num_steps: int,
                objective) -> list[float]:
    """The per-seed loop: seeds 0 .. num_seeds-1, one after another; their last losses."""
    if objective.loss_on != "all" or objective.contrastive:
        raise ValueError("the PyTorch baseline implements the plain next-token objective only "
                         "(train.loss_on='all', no contrastive_weights)")
    return [train_seed(s, train_tokens, model_cfg, train_cfg, num_steps,
                       objective.max_position_offset) for s in range(num_seeds)]


def threads() -> int:
    """The intra-op threads torch uses (its default: the machine's physical cores)."""
    return torch.get_num_threads()


def describe() -> str:
    """torch's version and where the loop runs, for the benchmark's header."""
    where = (torch.cuda.get_device_name() if torch.cuda.is_available()
             else f"CPU, {threads()} threads")
    return f"torch {torch.__version__}, {where}"
