"""Config fuzz test: for every key of every shipped config (jaxillusions/configs/),
values of the right and wrong types and magnitudes go through validation and the memory plan,
in process.

Each value must be accepted, or rejected with a one-line ValueError, without hanging; an
accepted config's memory plan must fit this machine (a larger one is rejected by validate). It
validates, it does not train. The number of cases tried is printed (pytest -s) and asserted.
"""

import contextlib
import copy
import functools
import importlib
import pathlib
import pkgutil
import signal
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ml_collections import ConfigDict

from jaxillusions import configs
from jaxillusions.pipeline import validate
from jaxillusions.training import memory, train

# The package's own files (a clone named jaxillusions holds its venv's libraries too).
PACKAGE = pathlib.Path(configs.__file__).resolve().parents[1]
NAMES = sorted(info.name for info in pkgutil.iter_modules(configs.__path__))
# A case still running after this long has hung (validation alone takes about 0.003-0.07 s on
# the 2-core CPU): the alarm interrupts it, so a hang fails the test instead of stalling it.
HANG_SECONDS = 5
TRIED = {"cases": 0}


@functools.cache
def _shipped(name: str) -> ConfigDict:
    # Not type-safe: values of the wrong type reach validation (ml_collections would refuse
    # some at assignment, the command-line flags others at parsing). cpu_devices 0: the test
    # process's devices (validate.check refuses another count once JAX runs; fuzzed too).
    module = importlib.import_module(f"jaxillusions.configs.{name}")
    config = ConfigDict(module.get_config().to_dict(), type_safe=False)
    config.cpu_devices = 0
    return config


def _config(name: str) -> ConfigDict:
    """A fresh copy of the shipped config, for one case to change: a deep copy, since building
    it anew (get_config, then a ConfigDict of its dict) took 4 times as long and was most of
    this file's time."""
    return copy.deepcopy(_shipped(name))


def _flat(config: ConfigDict) -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, ConfigDict):
            out.update({f"{key}.{k}": v for k, v in _flat(value).items()})
        else:
            out[key] = value
    return out


KEYS = {name: sorted(_flat(_shipped(name))) for name in NAMES}

SCALARS = st.one_of(
    st.integers(-3, 3), st.integers(-(10**20), 10**20), st.sampled_from([2**31, 2**63, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=12), st.sampled_from(["", "iid", "svd", "blocks.-1.attn.k", "float16"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4).map(tuple),
                   st.lists(st.integers(-2, 10**7), max_size=4).map(tuple))


def _set(config: ConfigDict, key: str, value) -> None:
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[last] = value


def _scaled(value, exponent: int):
    """The shipped value times 10**exponent, kept in its type (magnitudes of the right type)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return type(value)(value * 10**exponent) if exponent >= 0 else type(value)(
        value / 10**-exponent)


@contextlib.contextmanager
def _hang_guard(key: str, value):
    def hung(signum, frame):
        raise TimeoutError(f"validation of {key}={value!r} hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _check(name: str, key: str, value) -> None:
    config = _config(name)
    _set(config, key, value)
    with _hang_guard(key, value):
        _validate(config, key, value)
    TRIED["cases"] += 1


def _validate(config: ConfigDict, key: str, value) -> None:
    # A warning (cpu_devices above the cores, say) must be one line too; kept out of the
    # suite's summary, where a random draw would otherwise show it.
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            checked, notes = validate.check(config)
        except ValueError as err:
            message = str(err)
            assert message and "\n" not in message, (key, value, message)
        else:
            assert all(isinstance(n, str) and "\n" not in n for n in notes), (key, value, notes)
            # Accepted: its memory plan fits this machine (CPU: one pool of host RAM); a grid's
            # points each (a grid key set outside the grid is the grid's to set).
            runs = [p for _, p in validate.points(checked)] if checked.grid else [checked]
            for run in runs:
                need = sum(t.num_bytes for t in memory.plan(run, train.model_config(run)))
                assert need <= memory.host_ram(), (key, value, need)
    for w in warned:
        if pathlib.Path(w.filename).resolve().is_relative_to(PACKAGE):
            assert str(w.message) and "\n" not in str(w.message), (key, value, str(w.message))
        else:  # another library's: reported as pytest would have
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.mark.parametrize("name", NAMES)
def test_every_key_with_extreme_and_wrong_values(name):
    # Deterministic: every key once with a huge magnitude of its type and once with a wrong type.
    shipped, before = _flat(_shipped(name)), TRIED["cases"]
    for key in KEYS[name]:
        value = shipped[key]
        huge = (10**15 if isinstance(value, int) and not isinstance(value, bool) else
                1e300 if isinstance(value, float) else (10**15,) if isinstance(value, tuple)
                else "x" * 10_000)
        _check(name, key, huge)
        _check(name, key, "wrong type" if not isinstance(value, str) else 12345)
    # Every key of the config was tried both ways (counted in this test, so that it holds on
    # whichever xdist worker runs it); the count for a closing note: `pytest -s` prints it.
    assert TRIED["cases"] - before == 2 * len(KEYS[name]) > 0
    print(f"\nconfig fuzz {name}: {2 * len(KEYS[name])} cases over {len(KEYS[name])} keys")


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_values_are_accepted_or_one_line_errors(name, data):
    key = data.draw(st.sampled_from(KEYS[name]), label="key")
    shipped = _flat(_shipped(name))[key]
    value = data.draw(st.one_of(VALUES, st.integers(-6, 9).map(lambda e: _scaled(shipped, e))),
                      label="value")
    _check(name, key, value)
