"""The `jaxillusions` command (also `python -m jaxillusions`): one subcommand per launcher of
this folder, each handed the rest of the command line as its own flags.

    jaxillusions sweep --config=dyck_small --workdir=runs/dyck_small
    jaxillusions sweep --help
    jaxillusions --version

`jaxillusions SUB ARGS` runs the launcher's module as `python -m jaxillusions.launch.SUB ARGS`
does (the same module, run as __main__), so both spell the same job. The command's own help
imports no launcher and starts no JAX; `jaxillusions SUB --help` is the launcher's own help (its
docstring and flags).
"""

from __future__ import annotations

import os
import runpy
import sys
import textwrap

PROG = "jaxillusions"
HELP = ("-h", "--help", "-help", "--helpfull", "--helpshort")

# subcommand -> (launcher module of this folder: the name with "_" for "-", what it does).
SUBCOMMANDS = {
    "sweep": ("jaxillusions.launch.sweep", "the main job: train every seed, fit the proxies, "
              "evaluate every split, write tables, figures and TensorBoard"),
    "train": ("jaxillusions.launch.train", "train every seed of a config's sweep only"),
    "figures": ("jaxillusions.launch.figures", "draw the figures a finished run left out"),
    "wen-attention": ("jaxillusions.launch.wen_attention", "Wen et al.'s attention variation: "
                      "three architectures, one sweep each, one joined table"),
    "benchmark": ("jaxillusions.launch.benchmark", "speed side by side (needs a clone of the "
                  "repository: its benchmarks/ folder)"),
}


def version() -> str:
    """The installed distribution's version (importlib.metadata)."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("jaxillusions")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install the repository)"


def usage() -> str:
    from jaxillusions import configs  # noqa: PLC0415 - the file list only: no JAX

    width = max(map(len, SUBCOMMANDS)) + 4
    wrap = textwrap.TextWrapper(width=100, subsequent_indent=" " * width)
    lines = [f"usage: {PROG} [--version] [--help] SUBCOMMAND [flags]", "",
             "Interpretability illusions at sweep scale: simplified proxies of transformers, "
             "evaluated out of distribution.", "", "subcommands:"]
    lines += [wrap.fill(f"  {name:<{width - 4}}  {what}")
              for name, (_, what) in SUBCOMMANDS.items()]
    lines += ["", *textwrap.wrap(
        f"`{PROG} SUBCOMMAND --help` shows a subcommand's flags. --config names a shipped "
        "config, or the path of a config file of your own (a .py file with get_config(), which "
        "may start from `from jaxillusions.configs import dyck_small`); --config.<key>=VALUE "
        "overrides any key.", 100), "", *textwrap.wrap(
        "shipped configs: " + ", ".join(configs.names()), 100, subsequent_indent="  "), "",
        f"e.g. {PROG} sweep --config=dyck_small --workdir=runs/dyck_small"]
    return "\n".join(lines)


def check_config(args: list[str]) -> None:
    """A --config value (`--config=V` or `--config V`) that names no shipped config or no file
    with a get_config() is a one-line exit here, before the launcher's imports (JAX): the
    launcher checks it again, for `python -m jaxillusions.launch.<name>`."""
    from jaxillusions import configs  # noqa: PLC0415 - the file list only: no JAX

    for i, arg in enumerate(args):
        if arg in ("--", *HELP):
            return
        value = (arg.split("=", 1)[1] if arg.startswith("--config=") else
                 args[i + 1] if arg == "--config" and i + 1 < len(args) else None)
        if value is not None:
            try:
                configs.locate(value)
            except ValueError as err:
                sys.exit(f"error: {err}")


def main(argv: list[str] | None = None) -> None:
    """Dispatches `jaxillusions SUB ARGS` to the launcher of SUB, which parses ARGS as its own
    command line (absl flags; `benchmark`: argparse). Output into a pipe whose reader stopped
    (`jaxillusions sweep --help | head -1`) ends it quietly, with the status of SIGPIPE, as a
    Unix tool does."""
    try:
        _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        closed_pipe()


def closed_pipe() -> None:
    """Ends the process quietly after output into a pipe whose reader stopped reading, with the
    status of SIGPIPE (`python -m jaxillusions.launch.sweep --help | head -1` too)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush at exit
    sys.exit(141)


def _dispatch(args: list[str]) -> None:
    if not args or args[0] in (*HELP, "help"):
        print(usage(), flush=True)
        sys.exit(0 if args else 2)
    if args[0] == "--version":
        print(f"{PROG} {version()}", flush=True)
        sys.exit(0)
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        sys.exit(f"error: {PROG}: no subcommand {name!r}; choose from "
                 f"{', '.join(SUBCOMMANDS)} ({PROG} --help)")
    if name in ("sweep", "train", "benchmark"):  # (figures, wen-attention: no --config)
        check_config(rest)
    # The launcher sees the command line it would see as `python -m`: its name, then its flags.
    sys.argv = [f"{PROG} {name}", *rest]
    try:
        runpy.run_module(SUBCOMMANDS[name][0], run_name="__main__", alter_sys=False)
    except BrokenPipeError:
        raise  # main's
    except Exception as err:  # noqa: BLE001 - the launcher turns its own errors into one line;
        # what gets here failed before it could, in its imports (JAX reading a bad
        # JAX_NUM_CPU_DEVICES, a broken install): one line too.
        if "--debug" in rest:
            raise
        from jaxillusions.runtime.cache import error_line  # noqa: PLC0415 - on error only

        sys.exit(f"error: {error_line(err)} (--debug shows the traceback)")


if __name__ == "__main__":
    main()
