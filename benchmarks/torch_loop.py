"""The same model and optimizer in PyTorch, trained one seed after another (`train_seeds`: the
baseline a researcher would write first) and all seeds as one torch.func ensemble (`Ensemble`:
what a PyTorch user who wants many seeds writes, eager or through torch.compile);
`jaxillusions benchmark` times them when torch is installed.

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


def _check_objective(objective) -> None:
    if objective.loss_on != "all" or objective.contrastive:
        raise ValueError("the PyTorch baseline implements the plain next-token objective only "
                         "(train.loss_on='all', no contrastive_weights)")


def _model(seed: int, model_cfg, dev: torch.device) -> Transformer:
    """Seed `seed`'s initial model: the one home of a seed's initialization (loop and ensemble)."""
    torch.manual_seed(seed)
    return Transformer(model_cfg).to(dev)


def _optimizer(params, train_cfg):
    """objective.make_optimizer's AdamW (b1=0.9, b2=0.98, eps=1e-8, the config's weight decay)
    and its schedule (peak rate train.learning_rate), as (optimizer, scheduler): the loop's
    per-seed parameters, or the ensemble's stacked ones (AdamW is elementwise, so on stacked
    parameters it is each seed's update)."""
    opt = torch.optim.AdamW(params, lr=train_cfg.learning_rate, betas=(0.9, 0.98), eps=1e-8,
                            weight_decay=train_cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, _schedule(train_cfg))


def _batch(data: torch.Tensor, gen: torch.Generator, batch_size: int,
           max_position_offset: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One seed's next batch from its generator: sentences drawn with replacement, and each one's
    start position in [0, max_position_offset] (None where that is 0)."""
    dev = data.device
    rows = data[torch.randint(len(data), (batch_size,), generator=gen, device=dev)]
    offset = (torch.randint(max_position_offset + 1, (batch_size,), generator=gen, device=dev)
              if max_position_offset else None)
    return rows, offset


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over non-PAD targets (PAD = 0)."""
    nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                      reduction="none")
    mask = (targets.reshape(-1) != 0).float()
    return (nll * mask).sum() / mask.sum().clamp(min=1.0)


def _train_model(seed: int, train_tokens: np.ndarray, model_cfg, train_cfg, num_steps: int,
                 max_position_offset: int = 0) -> tuple[Transformer, float]:
    """train_seed's model after its steps (each parameter's .grad: the last clipped gradient),
    and its last loss."""
    dev = device()
    model = _model(seed, model_cfg, dev)
    opt, sched = _optimizer(model.parameters(), train_cfg)
    data = torch.from_numpy(np.asarray(train_tokens, np.int64)).to(dev)
    gen = torch.Generator(dev).manual_seed(seed)
    for _ in range(num_steps):
        batch, offset = _batch(data, gen, train_cfg.batch_size, max_position_offset)
        loss = _loss(model(batch[:, :-1], offset), batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        opt.step()
        sched.step()
    return model, float(loss.detach())


def train_seed(seed: int, train_tokens: np.ndarray, model_cfg, train_cfg, num_steps: int,
               max_position_offset: int = 0) -> float:
    """Builds one model and trains it for `num_steps` steps on random batches; returns the last
    loss. Next-token loss over non-PAD targets (PAD = 0); each sentence starts at a random
    position in [0, max_position_offset] (objective.Objective.max_position_offset)."""
    return _train_model(seed, train_tokens, model_cfg, train_cfg, num_steps,
                        max_position_offset)[1]


def train_seeds(num_seeds: int, train_tokens: np.ndarray, model_cfg, train_cfg, num_steps: int,
                objective) -> list[float]:
    """The per-seed loop: seeds 0 .. num_seeds-1, one after another; their last losses."""
    _check_objective(objective)
    return [train_seed(s, train_tokens, model_cfg, train_cfg, num_steps,
                       objective.max_position_offset) for s in range(num_seeds)]


def clip_by_global_norm(grads: dict[str, torch.Tensor], max_norm: float
                        ) -> dict[str, torch.Tensor]:
    """nn.utils.clip_grad_norm_'s formula on one seed's gradients, as a function (vmapped over
    the seeds, it clips each seed by its own global norm): the norm of the leaves' norms, and
    the factor min(1, max_norm / (norm + 1e-6))."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                 for g in grads.values()]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {name: g * factor for name, g in grads.items()}


class Ensemble:
    """All seeds as one torch.func ensemble: what a PyTorch user who wants many seeds writes.

    The seeds' models (each initialized as the loop initializes it) stacked with
    torch.func.stack_module_state; one step is torch.func.vmap over the seeds of
    torch.func.grad_and_value of torch.func.functional_call's loss, each seed's gradients
    clipped by its own global norm (`clip_by_global_norm`, inside the vmap); then torch.optim's
    AdamW and schedule (`_optimizer`) step the stacked parameters. Each seed draws its batches
    from its own generator, as in the loop, so seed s sees the batches of train_seed(s).
    `compiled`: the vmapped step function through torch.compile (compiled at its first call,
    once per seed count; the first call raises where torch.compile cannot run)."""

    def __init__(self, model_cfg, train_cfg, objective, *, compiled: bool = False):
        _check_objective(objective)
        self.model_cfg, self.train_cfg = model_cfg, train_cfg
        self.max_position_offset = objective.max_position_offset
        base = Transformer(model_cfg).to("meta")  # the architecture; parameters come stacked
        max_norm = train_cfg.grad_clip

        def loss(params, buffers, batch, offset):
            logits = torch.func.functional_call(base, (params, buffers), (batch[:, :-1], offset))
            return _loss(logits, batch[:, 1:])

        def step(params, buffers, batch, offset):
            grads, value = torch.func.grad_and_value(loss)(params, buffers, batch, offset)
            return clip_by_global_norm(grads, max_norm), value

        step = torch.func.vmap(step, in_dims=(0, 0, 0, 0 if self.max_position_offset else None))
        self.step = step
        if compiled:
            # Each ensemble compiles its own step (one per seed count, as the benchmark builds
            # them): forget the earlier ones' programs, so that no run of many seed counts
            # reaches dynamo's recompile limit (8 per function), which fullgraph makes an error.
            torch.compiler.reset()
            # fullgraph: a graph break raises, never runs eagerly in part
            self.step = torch.compile(step, dynamic=False, fullgraph=True)

    def train_params(self, seeds, train_tokens: np.ndarray, num_steps: int
                     ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Trains `seeds` for `num_steps` steps: (the stacked parameters [seed, ...] by
        named_parameters' names, each one's .grad the last clipped gradients; the last losses
        [seed])."""
        dev = device()
        models = [_model(s, self.model_cfg, dev) for s in seeds]
        params, buffers = torch.func.stack_module_state(models)
        opt, sched = _optimizer(list(params.values()), self.train_cfg)
        data = torch.from_numpy(np.asarray(train_tokens, np.int64)).to(dev)
        gens = [torch.Generator(dev).manual_seed(s) for s in seeds]
        for _ in range(num_steps):
            drawn = [_batch(data, g, self.train_cfg.batch_size, self.max_position_offset)
                     for g in gens]
            batch = torch.stack([rows for rows, _ in drawn])
            offset = torch.stack([o for _, o in drawn]) if self.max_position_offset else None
            grads, losses = self.step({k: p.detach() for k, p in params.items()}, buffers,
                                      batch, offset)
            for name, p in params.items():
                p.grad = grads[name]
            opt.step()
            sched.step()
        return params, losses.detach()

    def train(self, num_seeds: int, train_tokens: np.ndarray, num_steps: int) -> list[float]:
        """Seeds 0 .. num_seeds-1 in one ensemble; their last losses (as train_seeds)."""
        return self.train_params(range(num_seeds), train_tokens, num_steps)[1].tolist()


def threads() -> int:
    """The intra-op threads torch uses (its default: the machine's physical cores)."""
    return torch.get_num_threads()


def describe() -> str:
    """torch's version and where the loop runs, for the benchmark's header."""
    where = (torch.cuda.get_device_name() if torch.cuda.is_available()
             else f"CPU, {threads()} threads")
    return f"torch {torch.__version__}, {where}"
