"""Flags and error handling shared by the launchers.

Flags: --config (a shipped config's name, e.g. dyck_small, or the path of an ml-collections file
of your own, with overrides; every settings key the config leaves out is added at its default
before the overrides apply, so any key can be overridden), --workdir,
--start_over (train from step 0 when the workdir's checkpoints exist but none can be restored),
--debug (show tracebacks), and for several hosts --coordinator_address, --num_processes,
--process_id and --join_timeout (distributed.initialize).

`run(main)` is the door: it turns the config into Settings and checks the whole of it once
(validate.check) before any work, and hands main those Settings. It also takes the workdir lock,
turns on the persistent compilation cache, catches SIGTERM/SIGINT (the job saves and exits
143/130) and turns every error into one line on stderr.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence

from absl import flags
from ml_collections import ConfigDict, config_flags
from ml_collections.config_dict import placeholder

from jaxillusions import configs
from jaxillusions.launch import cli

# The flags that ask for a launcher's help (absl.app's, which the launchers do not run).
HELP = ("-h", "--help", "-help", "--helpfull", "--helpshort")


def with_defaults(config: ConfigDict) -> ConfigDict:
    """`config` with every key of jaxillusions/config/settings.py that it leaves out added at its
    default (validate.defaults of its task), so that `--config.<key>=` can override any key,
    whatever the file states. It changes no setting: a key a config leaves out takes that same
    default in validate.check (a renamed key's old name: a placeholder, read as unset).
    Keys the config sets keep their values and types; a bad task or a section that is not a
    ConfigDict is left for validate to name."""
    from jaxillusions import tasks  # noqa: PLC0415 - JAX only once a config loads
    from jaxillusions.config import settings  # noqa: PLC0415 - JAX only once a config loads
    from jaxillusions.pipeline import validate  # noqa: PLC0415

    task = config.get("task", "dyck")
    if not isinstance(task, str) or task not in tasks.TASKS:
        return config
    defaults = validate.defaults(task)
    for key, default in defaults.items():
        if not isinstance(default, dict):
            if key not in config:
                config[key] = default
            continue
        if key not in config:
            config[key] = ConfigDict()
        if isinstance(config[key], ConfigDict):
            for name, value in default.items():
                if name not in config[key]:
                    config[key][name] = value
    # The old name of a renamed key (settings.RENAMED) stays overridable for a release, as a
    # typed placeholder: None, which validate.check reads as unset.
    for old, new in settings.RENAMED.items():
        (section, name), (new_section, new_name) = old.split("."), new.split(".")
        if isinstance(config.get(section), ConfigDict) and name not in config[section]:
            config[section][name] = placeholder(type(defaults[new_section][new_name]))
    return config


def _config_dict(config) -> ConfigDict:
    """A get_config()'s mapping as a ConfigDict (a plain dict's keys overridable as a
    ConfigDict's)."""
    return config if isinstance(config, ConfigDict) else ConfigDict(dict(config))


class _ConfigWithDefaults(flags.ArgumentParser):
    """Loads the config file (configs.load), adds the keys it leaves out (with_defaults), then
    locks it: the overrides that ml_collections applies next may name any key, and only known
    keys."""

    def parse(self, argument):
        path = configs.locate(argument)
        try:
            config = configs.load(path)
        except Exception as err:  # noqa: BLE001 - the file's own error: one line, where it is
            raise ValueError(_config_file_error(argument, path, err)) from None
        if not hasattr(config, "keys"):  # (None: the launchers took the flag for unset)
            what = "None" if config is None else type(config).__name__
            raise ValueError(f"config file {argument}: get_config() returned {what}; it should "
                             "return a ConfigDict")
        config = with_defaults(_config_dict(config))
        config.lock()
        return config

    def flag_type(self) -> str:
        return "config object"


def _config_file_error(argument: str, path: str, err: BaseException) -> str:
    """'cannot load config file my.py, line 4: NameError: ...': the error a config file raised,
    at its last line in the file."""
    from jaxillusions.runtime.cache import error_line  # noqa: PLC0415 - on error only

    file = os.path.realpath(path.partition(":")[0])
    line, cause = None, err
    while cause is not None:  # the file's frame may be in a chained exception
        for frame in traceback.extract_tb(cause.__traceback__):
            if os.path.realpath(frame.filename) == file:
                line = frame.lineno
        cause = cause.__cause__ or cause.__context__
    return f"cannot load config file {argument}{f', line {line}' if line else ''}: " \
        + error_line(err)


def define_config_flag(flag_values: flags.FlagValues = flags.FLAGS, sys_argv=None):
    """The --config flag: ml_collections' config file flag (its overrides, --config.<key>=VALUE),
    the file (a shipped config's name or a path: configs.locate) read by _ConfigWithDefaults."""
    holder = config_flags.DEFINE_config_file(
        "config", None, "A shipped config's name (" + ", ".join(configs.names()) + ") or the "
        "path of a config file of your own (a .py file with get_config()); NAME:ARG passes ARG "
        "to get_config. Override any key with --config.<section>.<key>=VALUE.",
                                             flag_values=flag_values, lock_config=False,
                                             sys_argv=sys_argv)
    flag = flag_values["config"]
    flag.parser = _ConfigWithDefaults()
    return holder


class _Path(flags.ArgumentParser):
    """A path flag's value with a leading '~' expanded, as the shell does not after '='
    (`--workdir=~/runs/x` would otherwise make a directory named '~' here)."""

    def parse(self, argument):
        if not argument:  # (was: "workdir  cannot be written", later)
            raise ValueError("an empty path")
        return os.path.expanduser(argument)

    def flag_type(self) -> str:
        return "string"


CONFIG = define_config_flag()
WORKDIR = flags.DEFINE(_Path(), "workdir", None, "Directory for checkpoints, logs and results.")
START_OVER = flags.DEFINE_bool(
    "start_over", False, "If the workdir has checkpoints but none can be restored, move them to "
    "corrupt_checkpoints/ and train from step 0 (without it, that is an error).")
DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of an error.")
# Several hosts (jax.distributed): one process per host, each with the same command and its own
# --process_id; unset flags are read from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
# JAX_PROCESS_ID. One process (the default) needs none of them.
COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "HOST:PORT of process 0, which every process connects to.")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run (hosts).")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id, 0..num_processes-1.")
JOIN_TIMEOUT = flags.DEFINE_float(
    "join_timeout", 300.0, "Seconds to wait for every process to join; then an error names "
    "the ones missing.")


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_key(argv: list[str], path: str) -> str | None:
    """'unknown config key train.foo; train has: ...' for the first override that names no key."""
    try:
        config = with_defaults(_config_dict(configs.load(configs.locate(path))))
    except Exception:  # noqa: BLE001 - fall back to the flag library's own message
        return None
    for a in argv:
        if not a.startswith("--config."):
            continue
        key = a[len("--config."):].split("=", 1)[0]
        node, parts = config, key.split(".")
        for depth, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node:
                section = ".".join(parts[:depth]) or "the config"
                known = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "no keys"
                return f"unknown config key {key}; {section} has: {known}"
            node = node[part]
    return None


def _last_override_wins(argv: list[str]) -> list[str]:
    """argv without the earlier of repeated `--config.<key>=<value>` overrides: the last one
    wins, as for any other flag (ml_collections would concatenate repeated tuple overrides:
    (2,4) then (8,) gave (2, 4, 8))."""
    keys = [a.split("=", 1)[0] if a.startswith("--config.") and "=" in a else None
            for a in argv]
    last = {key: i for i, key in enumerate(keys) if key}
    return [a for i, (a, key) in enumerate(zip(argv, keys, strict=True))
            if not key or last[key] == i]


def _both_names(argv: list[str]) -> None:
    """A one-line exit where the command line overrides both names of a renamed key
    (settings.RENAMED) with different values: the config's new name at its default counts as
    unset (every key is written), so only here are both known to be given."""
    from jaxillusions.config import settings  # noqa: PLC0415 - a config has loaded: JAX is in

    given = {a[len("--config."):].partition("=")[0] for a in argv if a.startswith("--config.")}
    for old, new in settings.RENAMED.items():
        if old in given and new in given:
            values = [CONFIG.value[key.partition(".")[0]][key.partition(".")[2]]
                      for key in (old, new)]
            if values[0] != values[1]:
                sys.exit(f"error: {old}={values[0]!r} and {new}={values[1]!r}: {old} is the old "
                         f"name of {new}; set {new} only")


def usage(argv: list[str], doc: str | None, no_config: bool = False,
          unused: tuple[str, ...] = ()) -> str:
    """The help of a launcher: its docstring, then its flags and the shared ones (without
    --config for a launcher that takes none, nor the shared flags it does not take, `unused`)."""
    import inspect  # noqa: PLC0415

    lines = [f"usage: {argv[0]} [flags]", ""] + ([inspect.cleandoc(doc), ""] if doc else [])
    for module in dict.fromkeys((argv[0], sys.argv[0], __name__)):  # the launcher's, the shared
        text, hidden = [], False
        for line in flags.FLAGS.module_help(module).splitlines():
            if line.startswith("  --"):  # a flag's first line; its description follows
                hidden = any(line.startswith((f"  --{name}:", f"  --[no]{name}:")) for name in (
                    *(["config"] if no_config else []), *unused))
            if line.strip() and line.strip() != f"{module}:" and not hidden:
                text.append(line)
        if text:
            lines += ["flags:" if module == __name__ else "its own flags:", *text, ""]
    return "\n".join(lines).rstrip()


def check_config(argv: list[str]) -> None:
    """A --config value that names no shipped config, or no file with a get_config(), is a
    one-line exit here: before the flags are parsed, and before JAX starts."""
    value = _flag_value(argv, "config")
    if value is not None:
        try:
            configs.locate(value)
        except ValueError as err:
            sys.exit(f"error: {err}")


def parse_flags(argv: list[str], doc: str | None = None, no_config: str | None = None,
                positional: bool = False, unused: tuple[str, ...] = ()) -> list[str]:
    """Parses the flags; a bad flag or config override is a one-line error, not a traceback.
    A repeated `--config.<key>=` override: the last one wins. --help (or -h) prints `doc` (the
    launcher's docstring) and the flags, and exits. `no_config`: for a launcher that takes no
    config, the error line that refuses --config and its overrides. Returns the arguments that
    are not flags (after the program's name), which only a launcher that takes them
    (`positional`: figures' workdir) may be given: elsewhere one is an error (an override
    typed without its dashes had been ignored, and the config run as shipped). `unused`: shared
    flags the launcher does not take (left out of its help; given, a one-line error)."""
    if any(a in HELP for a in argv[1:argv.index("--") if "--" in argv else len(argv)]):
        try:
            print(usage(argv, doc, no_config=bool(no_config), unused=unused), flush=True)
        except BrokenPipeError:
            cli.closed_pipe()
        sys.exit(0)
    override = next((a.partition("=")[0] for a in argv[1:] if a.startswith("--config.")), None)
    given = _flag_value(argv, "config") is not None
    if no_config and (given or override):
        sys.exit(f"error: {no_config}")
    if override and not given:  # (the flag library: "Unknown command line flag")
        sys.exit(f"error: {override}: a config override needs --config, e.g. "
                 f"--config=dyck_small {override}=VALUE")
    check_config(argv)
    argv = _last_override_wins(argv)
    try:
        rest = flags.FLAGS(argv)[1:]
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as err:
        path = _flag_value(argv, "config")
        message = _unknown_key(argv, path) if path else None
        lines = [line for line in str(err).splitlines() if line.strip()] or [repr(err)]
        # The config file's error (_config_file_error) without the flag library's prefix.
        message = message or lines[0].removeprefix(f"flag --config={path}: ")
        sys.exit(f"error: {message}")
    _both_names(argv)
    for name in unused:
        if flags.FLAGS[name].present:
            sys.exit(f"error: --{name}: {argv[0]} does not take it ({argv[0]} --help)")
    if rest and not positional:
        hint = f" (a flag starts with --: --{rest[0]})" if rest[0].startswith("config.") else ""
        sys.exit(f"error: unexpected argument {rest[0]!r}{hint}; {argv[0]} takes flags only "
                 f"({argv[0]} --help)")
    return rest


def parse(argv: list[str], doc: str | None = None):
    """parse_flags, then (config, workdir): both are required, and the config (a shipped name
    or a file) must exist and load."""
    path = _flag_value(argv, "config")
    parse_flags(argv, doc)
    if CONFIG.value is None or WORKDIR.value is None:
        sys.exit("error: --config and --workdir are required, e.g. "
                 "--config=dyck_small --workdir=runs/dyck_small")
    try:
        config = CONFIG.value
        config.keys()
    except Exception as err:  # noqa: BLE001 - a config file that does not load
        sys.exit(f"error: cannot load config file {path}: {str(err).splitlines()[0]}")
    return config, WORKDIR.value


def run(main) -> None:
    """Runs main(settings, workdir, start_over=...) after turning the config into checked
    Settings (guard: validate.check, once) and taking the workdir lock; every error becomes one
    line on stderr (--debug shows the traceback). --help prints the docstring of main's module
    and the flags."""
    config, workdir = parse(sys.argv, main.__globals__.get("__doc__"))
    guard(lambda settings: main(settings, workdir, start_over=START_OVER.value), workdir,
          [config])


def use_compilation_cache() -> str | None:
    """Keeps XLA's compiled programs on disk (JAX's persistent compilation cache), so that a
    resumed run, or another run with the same shapes, loads them instead of compiling again. A
    loaded program is the one that was compiled, so the numbers are the same bit for bit.

    The directory is $JAX_COMPILATION_CACHE_DIR when set, else `xla/` in the data cache
    ($JAXILLUSIONS_CACHE or ~/.cache/jaxillusions). JAX_ENABLE_COMPILATION_CACHE=false turns
    it off. An unreadable entry is a warning line and the program is compiled again; an entry
    that cannot be written (a full disk) is one warning line for the whole run. Only process 0
    writes. Returns the directory, or None when the cache is off."""
    import jax  # noqa: PLC0415

    from jaxillusions.runtime import cache  # noqa: PLC0415

    if not jax.config.jax_enable_compilation_cache:
        return None
    directory = jax.config.jax_compilation_cache_dir or cache.path("xla")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:  # e.g. $JAXILLUSIONS_CACHE names a file
        print(f"warning: compiled programs are not cached: {type(err).__name__}: {err}",
              file=sys.stderr)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    show, write_failed = warnings.showwarning, False

    def one_line(message, category, filename, lineno, file=None, line=None):
        nonlocal write_failed
        # JAX warns, with its own source line, for each entry it cannot read, and keeps the
        # entry: remove that program's entries so that the next compilation writes them anew.
        text = str(message)
        if "persistent compilation cache" not in text:
            return show(message, category, filename, lineno, file, line)
        if not text.startswith("Error reading"):  # writing: a full or read-only disk, once
            if not write_failed:
                write_failed = True
                print(f"warning: {text.splitlines()[0]} (not cached; the run goes on, and "
                      "further write errors of the cache are not shown)", file=sys.stderr)
            return None
        program = re.search(r"entry for '([^']+)'", text)
        if program:
            for entry in glob.glob(os.path.join(glob.escape(directory),
                                                f"{glob.escape(program[1])}-*")):
                with contextlib.suppress(OSError):
                    os.remove(entry)
        print(f"warning: {text.splitlines()[0]} (compiled instead)", file=sys.stderr)
        return None

    warnings.showwarning = one_line
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX keeps only programs that took a second or more to compile; on a CPU most take
        # less, and together they are a tenth of the Quickstart job.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def _own_warnings_on_one_line() -> None:
    """The project's own warnings (a data cache that cannot be written, say) as one `warning:`
    line on stderr instead of Python's two (file:line and the source line)."""
    import jaxillusions  # noqa: PLC0415

    show, package = warnings.showwarning, os.path.dirname(os.path.abspath(jaxillusions.__file__))

    def one_line(message, category, filename, lineno, file=None, line=None):
        if not os.path.abspath(filename).startswith(package + os.sep):
            return show(message, category, filename, lineno, file, line)
        print(f"warning: {str(message).splitlines()[0]}", file=sys.stderr)
        return None

    warnings.showwarning = one_line


# Python's garbage collector looks at the young objects after this many allocations (its
# default: 700). Tracing a program allocates millions of short-lived objects, most without
# cycles, so that at 700 the collector ran a thousand times in the Quickstart job.
GC_YOUNG = 10_000


def settle_heap() -> None:
    """Before the work of a process whose imports are done: the garbage of the start collected,
    then the heap that will outlive the work (the imported modules, the configs) frozen, so that
    Python's full collections, which tracing programs triggers again and again, no longer walk
    it; and young collections every GC_YOUNG allocations. In the Quickstart job the collector
    took 4.5 s before, 1.0 s after (docs/speed.md, "Python's garbage collector")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])


def guard(job: Callable[..., None], workdir: str, configs: Sequence, pipeline=None) -> None:
    """Runs job(*settings) after turning every config into checked Settings (validate.check,
    with `pipeline`'s stages, default the main job's: the configs are read here, once, and the
    job gets Settings only) and taking the workdir
    lock, with SIGTERM/SIGINT caught (the job saves and exits 143/130); every error becomes one
    line on stderr."""
    from jaxillusions.pipeline import validate  # noqa: PLC0415
    from jaxillusions.runtime import (
        checkpoint,  # noqa: PLC0415
        distributed,  # noqa: PLC0415
        interrupt,  # noqa: PLC0415
    )

    if not DEBUG.value:
        _quiet_background_errors(workdir)
        _own_warnings_on_one_line()
    lock = checkpoint.WorkdirLock(workdir)
    try:
        # Nothing here starts JAX before validate.check, which sets the config's cpu_devices
        # first (JAX's first operation fixes them); jax.distributed must start before it too.
        distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value,
                               JOIN_TIMEOUT.value)
        compile_cache = use_compilation_cache()
        checked, notes = [], []
        for config in configs:  # a second config naming other cpu_devices is refused here
            settings, config_notes = validate.check(config, *([pipeline] if pipeline else []))
            checked.append(settings)
            notes += config_notes
        if distributed.is_main():  # (which starts JAX: asked only once the checks are done)
            if compile_cache:
                print(f"compiled programs: cached in {compile_cache} "
                      "(JAX_ENABLE_COMPILATION_CACHE=false turns this off)")
            for note in notes:
                print(note)
        note = lock.acquire() if distributed.is_main() else None  # process 0 writes the files
        if note:
            print(note)
        settle_heap()
        with interrupt.catch_signals():
            job(*checked)
        code, message = 0, None
    except interrupt.Stopped as err:
        if DEBUG.value:
            raise
        prefix = "" if err.exit_code in interrupt.EXIT_CODES.values() else "error: "
        code, message = err.exit_code, f"{prefix}{err}"
    except KeyboardInterrupt:  # Ctrl-C outside catch_signals (a second signal: interrupt.py)
        if DEBUG.value:
            raise
        code, message = 130, ("error: stopped at once by SIGINT (work since the last "
                              "checkpoint is lost); relaunch the same command to resume")
    except (ValueError, OSError) as err:  # our one-line errors, and errors of the system
        if DEBUG.value:
            raise
        own = type(err).__module__.startswith("jaxillusions") or type(err) in (ValueError,
                                                                                 OSError)
        text = str(err).splitlines()[0] if own and str(err) else checkpoint.root_cause(err)
        # (a collective whose peer process died can surface as a plain ValueError or OSError)
        code, message = 1, distributed.lost_peer_line(err) or f"error: {text}"
    except Exception as err:  # noqa: BLE001 - one line per error; --debug shows the traceback
        if DEBUG.value:
            raise
        code, message = 1, (distributed.lost_peer_line(err) or
                            f"error: {checkpoint.root_cause(err)} (--debug shows the traceback)")
    finally:
        lock.release()
    if message is None:
        # Done: end as Python's own exit does (its threads joined, its atexit handlers run:
        # jax.distributed's shutdown, multiprocessing's helpers, logging), without the teardown
        # of the 2,600 imported modules that would follow (0.6 s of every launch).
        import atexit  # noqa: PLC0415
        import threading  # noqa: PLC0415

        threading._shutdown()  # noqa: SLF001 - what the interpreter calls first at exit
        atexit._run_exitfuncs()  # noqa: SLF001
    else:
        print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is saved and closed by now. After an error, skipping interpreter shutdown keeps
    # library threads that failed with it (orbax writers on a full disk) from printing
    # tracebacks after it.
    os._exit(code)


def _quiet_background_errors(workdir: str) -> None:
    """Library threads (orbax, asyncio) report their failures as logged tracebacks, dozens of
    them for one full disk or one corrupt checkpoint; the main thread raises the error that
    matters. Without --debug, send those reports to <workdir>/errors.log instead of stderr."""
    import logging  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    def to_file(text: str) -> None:
        try:
            with open(os.path.join(workdir, "errors.log"), "a") as f:
                f.write(text + "\n")
        except Exception:  # noqa: BLE001 - e.g. the disk is full, or Python is shutting down
            pass

    class ToFile(logging.Handler):
        def emit(self, record):
            to_file(self.format(record))

    absl_logger = logging.getLogger("absl")
    absl_logger.handlers[:] = [ToFile()]
    absl_logger.propagate = False
    sys.unraisablehook = lambda u: to_file("".join(traceback.format_exception(
        u.exc_type, u.exc_value, u.exc_traceback)) if u.exc_value else str(u.err_msg))
    threading.excepthook = lambda a: to_file("".join(traceback.format_exception(
        a.exc_type, a.exc_value, a.exc_traceback)))
