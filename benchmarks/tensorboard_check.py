"""TensorBoard at its defaults, in a real browser: what a reader sees first on the landing page
(Time Series), SCALARS, HPARAMS and TEXT of a run's logs, with screenshots:

    python -m benchmarks.tensorboard_check runs/dyck_small/tensorboard --out runs/board_shots

Starts `tensorboard --logdir <logdir> --host 127.0.0.1 --port <a free port>` (everything else
at its defaults: the settings a new reader has), opens each dashboard in headless Chromium with
Playwright, saves landing.png, scalars.png, hparams.png, hparams_metrics.png (the table scrolled
to its metric columns) and text.png under --out, prints what it read from the pages as JSON
(also written to --out/check.json) and checks:

- landing page and SCALARS: the first card group is runtime/tensorboard.py's HEADLINE;
- landing page: each Headline card drawn shows its point unsmoothed (the data table's Smoothed
  equals its Value) at the training step the report names;
- HPARAMS: the metric columns shown by default are the first metrics the logs list, in that
  order, and all are per-seed gaps (log_lib.HPARAMS_GAP) on the Headline cards' (OOD) splits;
- TEXT: the headline summary (log_lib.SUMMARY_TAG) comes first.

Exit status 0: all checks pass; 1: a check fails; 2: TensorBoard or the browser could not be
started or a page did not load in time. The server is stopped on every path, and every wait is
bounded (--timeout). Needs Chromium (Debian: `apt-get install chromium`) and Playwright for
Python (`pip install -e '.[board-check]'`); Playwright's own browser download is not used:
--chromium names the executable (default: the first of chromium, chromium-browser,
google-chrome on PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import decimal
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.runtime.tensorboard import read_scalars

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")

# Elements matching a CSS selector anywhere in the page, inside shadow roots too (the HPARAMS
# and SCALARS dashboards are Polymer elements).
_FIND = """(sel) => { const out = [];
  const walk = (n) => { if (!n) return;
    if (n.nodeType === 1) { if (n.matches(sel)) out.push(n); if (n.shadowRoot) walk(n.shadowRoot); }
    for (const c of n.childNodes || []) walk(c); };
  walk(document.body); return out; }"""


def _shows(text: str, value: float) -> bool:
    """Whether `text` (a number as TensorBoard prints it, e.g. '0.0189', '-7e-4') is `value`
    rounded to the digits it shows."""
    try:
        shown = decimal.Decimal(text.replace("\u2212", "-"))
    except decimal.InvalidOperation:
        return False
    return abs(float(shown) - value) <= 0.5 * 10.0 ** shown.as_tuple().exponent * (1 + 1e-6)


class Unavailable(RuntimeError):
    """TensorBoard or the browser could not be started, or a page did not load in time."""


def find_chromium() -> str | None:
    """The first Chromium-like executable on PATH, or None."""
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (127.0.0.1)
        return json.loads(response.read())


def _runs(logdir: str) -> set[str]:
    """The runs TensorBoard should list: the directories holding event files."""
    return {os.path.relpath(root, logdir).replace(os.sep, "/")
            for root, _, files in os.walk(logdir) if any("tfevents" in f for f in files)}


@contextlib.contextmanager
def serve(logdir: str, log_path: str, timeout: float = 120.0) -> Iterator[str]:
    """A TensorBoard server on `logdir` at 127.0.0.1 (a free port, its output in `log_path`);
    yields its URL once it lists every run of the logdir. Stopped on exit, whatever happens
    (terminate; kill after 10 s)."""
    port = _free_port()
    expected = _runs(logdir)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", os.path.abspath(logdir),
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, listed = time.monotonic() + timeout, set()
        while not expected <= listed | {"."}:
            if process.poll() is not None:
                raise Unavailable(f"tensorboard exited with status {process.returncode}; "
                                  f"its output: {log_path}")
            if time.monotonic() > deadline:
                raise Unavailable(f"tensorboard listed {len(listed)} of the {len(expected)} "
                                  f"runs of {logdir} after {timeout:.0f} s; missing: "
                                  f"{sorted(expected - listed)[:5]}")
            time.sleep(1.0)
            with contextlib.suppress(OSError, ValueError):
                listed = set(_request(f"{url}/data/runs"))
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _open(browser, url: str, ready: str, timeout: float, width: int, height: int):
    """A new page at `url`, once the JS expression `ready` is true (Unavailable if not within
    `timeout` s), and a second for the charts to draw."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(timeout * 1000)
    page.goto(url)
    try:
        page.wait_for_function(ready, timeout=timeout * 1000)
    except Exception as err:  # playwright's TimeoutError
        raise Unavailable(f"{url}: not ready after {timeout:.0f} s ({ready})") from err
    time.sleep(2.0)
    return page


def _landing(browser, url: str, out: str, timeout: float, size) -> dict:
    page = _open(browser, url + "/", "document.querySelectorAll('.card-group').length > 0",
                 timeout, *size)
    with contextlib.suppress(Exception):  # the first card's chart and data table
        page.wait_for_selector(".card-group tb-data-table", timeout=timeout * 1000)
        time.sleep(1.0)
    page.screenshot(path=os.path.join(out, "landing.png"))
    return page.evaluate("""() => {
      const groups = Array.from(document.querySelectorAll('.card-group'));
      const first = groups[0];
      const cards = first ? Array.from(first.querySelectorAll('card-view')).map((card) => {
        const path = card.querySelector('tb-truncated-path');
        const table = card.querySelector('tb-data-table');
        return {tag: path ? path.getAttribute('title') : null,
                table: table ? table.innerText.split(/\\s+/).filter((s) => s) : null};
      }).filter((c) => c.tag) : [];  // the cards drawn so far (Time Series draws lazily)
      return {groups: groups.map((g) => g.querySelector('.group-title').textContent.trim()),
              first_group_cards: cards};
    }""")


def _scalars(browser, url: str, out: str, timeout: float, size) -> dict:
    ready = f"({_FIND})('tf-category-paginated-view').some((v) => v.category && v.category.name)"
    page = _open(browser, url + "/#scalars", ready, timeout, *size)
    page.screenshot(path=os.path.join(out, "scalars.png"))
    # The first category is the tag filter's (no name); then the tag groups, in order.
    groups = page.evaluate(f"""() => ({_FIND})('tf-category-paginated-view')
        .filter((v) => v.category && v.category.name)
        .map((v) => ({{name: v.category.name, cards: v.category.items.length,
                       opened: v.opened}}))""")
    return {"groups": groups}


def _hparams(browser, url: str, out: str, timeout: float, size) -> dict:
    ready = f"({_FIND})('tf-hparams-table-view vaadin-grid-column, vaadin-grid-column').length > 2"
    page = _open(browser, url + "/#hparams", ready, timeout, *size)
    page.screenshot(path=os.path.join(out, "hparams.png"))
    # The header row: the first cell contents, one per column, in the columns' order.
    header = page.evaluate(f"""() => {{
      const n = ({_FIND})('vaadin-grid-column').length;
      return ({_FIND})('vaadin-grid-cell-content').slice(0, n)
        .map((c) => c.textContent.trim()); }}""")
    page.evaluate(f"""() => ({_FIND})('vaadin-grid').forEach((g) => {{
      const t = g.shadowRoot && g.shadowRoot.querySelector('#table');
      if (t) t.scrollLeft = t.scrollWidth; }})""")
    time.sleep(1.0)
    page.screenshot(path=os.path.join(out, "hparams_metrics.png"))
    return {"header": header}


def _text(browser, url: str, out: str, timeout: float, size) -> dict:
    ready = f"({_FIND})('tf-text-loader').length > 0"
    page = _open(browser, url + "/#text", ready, timeout, *size)
    page.screenshot(path=os.path.join(out, "text.png"))
    tags = page.evaluate(f"""() => ({_FIND})('tf-text-loader').map((l) => l.tag)""")
    return {"tags": tags}


def check(logdir: str, out: str, chromium: str, timeout: float = 120.0,
          size: tuple[int, int] = (1600, 1000)) -> dict:
    """What the dashboards show (see the module docstring) and `failures`, a list of what
    failed. Raises Unavailable when the server, the browser or a page cannot be had."""
    from playwright.sync_api import sync_playwright

    os.makedirs(out, exist_ok=True)
    seen: dict[str, Any] = {"logdir": os.path.abspath(logdir)}
    with serve(logdir, os.path.join(out, "tensorboard.log"), timeout) as url:
        experiment = _request(f"{url}/data/plugin/hparams/experiment", {"experimentName": ""})
        text_tags = _request(f"{url}/data/plugin/text/tags")
        seen["tensorboard"] = _request(f"{url}/data/environment").get("version")
        with sync_playwright() as playwright:
            try:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True)
            except Exception as err:
                raise Unavailable(f"cannot start {chromium}: {err}") from err
            try:
                seen["landing"] = _landing(browser, url, out, timeout, size)
                seen["scalars"] = _scalars(browser, url, out, timeout, size)
                seen["hparams"] = _hparams(browser, url, out, timeout, size)
                if text_tags:
                    seen["text"] = _text(browser, url, out, timeout, size)
            finally:
                browser.close()

    failures = []
    groups = [g for g in seen["landing"]["groups"] if g != "Pinned"]  # always there, empty
    if groups[:1] != [log_lib.HEADLINE]:
        failures.append(f"landing page: first card group {groups[:1]}, not {log_lib.HEADLINE}")
    cards = seen["landing"]["first_group_cards"]
    drawn = [c for c in cards if c["table"]]
    if not drawn:
        failures.append("landing page: no Headline card drew its data table")
    logged = {t: points for tags in read_scalars(logdir).values() for t, points in tags.items()
              if t.startswith(log_lib.HEADLINE + "/")}
    for card in drawn:  # Run Smoothed Value Step Relative, then a row per run
        columns = card["table"][:5]
        for row in zip(*[iter(card["table"][5:])] * 5, strict=False):
            values = dict(zip(columns, row, strict=True))
            points = logged.get(card["tag"], [])
            if values.get("Smoothed") != values.get("Value") or len(points) != 1 or not (
                    _shows(values.get("Value", ""), points[0][1])
                    and values.get("Step", "").replace(",", "") == str(points[0][0])):
                failures.append(f"landing page: {card['tag']} shows {values}; logged {points}")
    scalar_groups = [g["name"] for g in seen["scalars"]["groups"]]
    if scalar_groups[:1] != [log_lib.HEADLINE]:
        failures.append(f"SCALARS: first group {scalar_groups[:1]}, not {log_lib.HEADLINE}")
    metrics = experiment.get("metricInfos", [])
    names = [m.get("displayName") or m["name"]["tag"] for m in metrics]
    shown = [h for h in seen["hparams"]["header"] if h in names]
    seen["hparams"]["metric_columns"] = shown
    if not shown or shown != names[:len(shown)]:
        failures.append(f"HPARAMS: metric columns {shown}, the logs list {names[:5]} first")
    # The gaps shown are on the Headline's splits (the OOD ones: no in-distribution control).
    ood = {t.rsplit("/gap_", 1)[-1] for t in logged}
    if not all(m["name"]["tag"].startswith(log_lib.HPARAMS_GAP)
               and m["name"]["tag"].rsplit("/", 1)[-1] in ood for m in metrics[:len(shown)]):
        failures.append(f"HPARAMS: not all of the shown metrics are gaps on the Headline's "
                        f"splits {sorted(ood)}: {names[:len(shown)]}")
    if text_tags and seen["text"]["tags"][:1] != [log_lib.SUMMARY_TAG]:
        failures.append(f"TEXT: first {seen['text']['tags'][:1]}, not {log_lib.SUMMARY_TAG}")
    seen["failures"] = failures
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", help="a run's TensorBoard logdir, e.g. <workdir>/tensorboard")
    parser.add_argument("--out", default="tensorboard_check",
                        help="folder for the screenshots and check.json")
    parser.add_argument("--chromium", default=None, help="the browser executable")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the server and for each page")
    parser.add_argument("--size", default="1600x1000", help="the browser window, WxH")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.logdir) or not _runs(args.logdir):
        parser.error(f"{args.logdir}: no TensorBoard event files under it")
    chromium = args.chromium or find_chromium()
    if chromium is None:
        print(f"no browser: none of {', '.join(CHROMIUM)} on PATH (--chromium names one)",
              file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("Playwright is not installed: pip install -e '.[board-check]'", file=sys.stderr)
        return 2
    width, height = (int(v) for v in args.size.lower().split("x"))
    try:
        seen = check(args.logdir, args.out, chromium, args.timeout, (width, height))
    except Unavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump(seen, f, indent=1)
    print(json.dumps(seen, indent=1))
    for failure in seen["failures"]:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"screenshots: {args.out}/", file=sys.stderr)
    return 1 if seen["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
