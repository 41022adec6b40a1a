"""The machine a run computes on, as far as its bits depend on it: the CPU model, the devices,
jax and jaxlib, XLA's flags and JAX's matmul precision. XLA compiles for the machine it runs on,
so another CPU model, device kind or count, version or flag rounds some operations differently
in the last bit (docs/reliability.md, Reproducibility). A workdir records it in
config_history.jsonl (checkpoint.claim_workdir), and a relaunch on another machine says so in one
line. JAX's settings under which the code would fail or draw other members from the same seeds
are refused at the door (check_jax_config)."""

from __future__ import annotations

import os
import platform
import subprocess


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers, which tell apart generations that
    share a name ("AMD EPYC, family 25 model 17"): lscpu's "Model name", "CPU family" and "Model",
    else /proc/cpuinfo's "model name", "cpu family" and "model", else platform.processor() (empty
    on some systems), else "unknown"."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for text, keys in ((out, ("Model name", "CPU family", "Model")),
                       (_read("/proc/cpuinfo"), ("model name", "cpu family", "model"))):
        fields = {}
        for line in text.splitlines():
            key, colon, value = line.partition(":")
            if colon and key.strip() in keys:
                fields.setdefault(key.strip(), value.strip())
        name, family, model = (fields.get(key) for key in keys)
        if name:
            return f"{name}, family {family} model {model}" if family and model else name
    return platform.processor() or "unknown"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def describe() -> dict[str, str]:
    """{cpu, devices, jax, jaxlib, xla_flags, matmul_precision} of this process, JAX started (its
    devices are counted): devices as "2 x cpu" or "8 x NVIDIA H200" over all processes; the flags
    that take effect (XLA reads them in turn: a flag named twice keeps its last value), sorted by
    name; jax_default_matmul_precision ("default" where unset: TF32 for float32 on GPUs that
    have it)."""
    from importlib.metadata import version  # noqa: PLC0415

    import jax  # noqa: PLC0415

    return {"cpu": cpu_model(),
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "jax": jax.__version__, "jaxlib": version("jaxlib"),
            "xla_flags": flags(os.environ.get("XLA_FLAGS", "")),
            "matmul_precision": str(jax.config.jax_default_matmul_precision or "default")}


# JAX's settings the code is written for: the values it allows, and what it does under another.
# Found by running the Quickstart's model at each: 64-bit defaults failed in k-means' fit, after
# training; strict dtype promotion and rank promotion that raises failed at the first training
# step; another random generator, or threefry's other mode, trained other models from the same
# seeds, and a checkpoint's keys would not resume under it.
REQUIRED_JAX_CONFIG = {
    "jax_enable_x64": ((False,), "the code computes in 32 bits and fails partway under "
                       "64-bit defaults"),
    "jax_numpy_dtype_promotion": (("standard",), "the code relies on JAX's standard "
                                  "promotion and fails partway under another"),
    "jax_numpy_rank_promotion": (("allow", "warn"), "the code broadcasts by rank and fails "
                                 "partway where that raises"),
    "jax_default_prng_impl": (("threefry2x32",), "another random generator draws other members "
                              "from the same seeds"),
    "jax_threefry_partitionable": ((True,), "threefry's other mode draws other members from the "
                                   "same seeds"),
}


def check_jax_config() -> None:
    """A one-line ValueError for the first of JAX's settings (REQUIRED_JAX_CONFIG) that this
    process holds at a value the code is not written for, naming its variable and the fix."""
    import jax  # noqa: PLC0415

    for name, (allowed, why) in REQUIRED_JAX_CONFIG.items():
        value = getattr(jax.config, name)
        value = getattr(value, "value", value)  # an enum's value ("strict")
        if value not in allowed:
            raise ValueError(f"{name.upper()}={value} (JAX's {name}): {why}; unset "
                             f"{name.upper()}, or call jax.config.update({name!r}, "
                             f"{allowed[0]!r}) before the run")


def flags(text: str) -> str:
    """XLA_FLAGS as they take effect, one per name (the last), sorted by name."""
    last = {flag.split("=", 1)[0]: flag for flag in text.split()}
    return " ".join(last[name] for name in sorted(last))


def changed(before: dict, now: dict) -> str:
    """The entries of `now` that differ from `before` as "key: before -> now" joined by "; "
    (empty if none); an entry one side lacks reads "(not recorded)"."""
    return "; ".join(f"{key}: {before.get(key, '(not recorded)') or '(none)'} -> "
                     f"{now.get(key, '(not recorded)') or '(none)'}"
                     for key in sorted(set(before) | set(now))
                     if before.get(key) != now.get(key))
