#!/usr/bin/env python3
"""Checks the aggregator's built-in dashboard in a real browser, against a real aggregator.

It starts an aggregator (loopback, free ports, a temporary data dir) and four agents
(web-1 to web-4, regions eu/us/ap/eu), sends them a week of synthetic traffic with
`hourglass simulate` in three parts so that web-4 misses six hours on the third day, stops
the agents (each ships what it holds), then drives headless Chromium over the DevTools
protocol (a pipe, no network port) and compares what the page shows, read from its data
attributes once <body data-state="ready">, with the JSON API's answers for the same view,
fetched directly:

  visitors per hour, 1280x900   the chart (band, line, one point per group and each
                                point's numbers), the total, the coverage grid (servers x
                                days, the gap), the top-K table, a membership lookup, the
                                servers and labels; a whole-page screenshot
  switched to per day           the `per` menu: the URL and the chart follow
  pages per day (auto), phone   the same on a 390x844 mobile viewport, without sideways
                                scrolling; a screenshot
  an unknown metric             the API's error message is on the page
  the same data behind a token  the page asks for one; typed in, it is kept in session
                                storage and the page answers; a wrong one is refused

The page's scripts must throw nothing, and the screenshots must not be blank (decoded
here: colours, pixels off the background). Only the Python standard library is used.

  check_dashboard.py --bin-dir target/debug --chromium /usr/bin/chromium [--screenshot-to FILE] [--keep]
"""

import argparse
import base64
import json
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import ProxyHandler, Request, build_opener

SERVERS = [("web-1", "eu"), ("web-2", "us"), ("web-3", "ap"), ("web-4", "eu")]
EVENTS_PER_HOUR = 1000
# web-4 is down for these hours of the simulated week (hours from its start).
GAP_START, GAP_HOURS = 60, 6
DESKTOP = (1280, 900)
PHONE = (390, 844)
TOKEN_ENV = "HOURGLASS_TEST_DASHBOARD_TOKEN"


class Failure(Exception):
    """A check that did not hold; the message says which and why."""


def log(message):
    print(f"check-dashboard: {message}", file=sys.stderr, flush=True)


def die_with_parent():
    """In a child: SIGTERM when this checker dies, however it dies (Linux prctl)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child_env(extra=None):
    """This environment without HOURGLASS_* settings (they would change the flags' meaning)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    env.update(extra or {})
    return env


# ------------------------------------------------------------------ processes


class Service:
    """A server process whose `NAME listening on ADDR` lines on stderr give its addresses."""

    def __init__(self, name, argv, announces, log_path, env=None, timeout=60):
        self.name = name
        self.log_path = log_path
        self.log_file = open(log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.PIPE,
            env=child_env(env), text=True, errors="replace", preexec_fn=die_with_parent)
        lines = queue.Queue()

        def drain():
            # Keep reading so the process never blocks on a full pipe; keep the log.
            for line in self.process.stderr:
                self.log_file.write(line)
                self.log_file.flush()
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        self.addrs = {}
        deadline = time.monotonic() + timeout
        while len(self.addrs) < len(announces):
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise Failure(f"{name} did not announce {', '.join(announces)} within {timeout}s (log: {log_path})")
            if line is None:
                self.stop()
                raise Failure(f"{name} exited before announcing its ports:\n{tail(log_path)}")
            head, sep, addr = line.strip().partition(" listening on ")
            if sep and head in announces:
                self.addrs[head] = addr.strip()

    def stop(self, expect_clean=False):
        """SIGTERM, then SIGKILL after 30 s; with expect_clean, a non-zero exit is a failure."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if expect_clean and self.process.returncode != 0:
            raise Failure(f"{self.name} exited with {self.process.returncode}:\n{tail(self.log_path)}")


def tail(path, lines=15):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def run(argv, what, timeout=600):
    started = time.monotonic()
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                                timeout=timeout, env=child_env(), preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:
        raise Failure(f"{what} did not finish within {timeout}s") from None
    if result.returncode != 0:
        raise Failure(f"{what} failed ({result.returncode}):\n{result.stdout}{result.stderr[-3000:]}")
    log(f"{what}: {result.stdout.strip() or 'done'} ({time.monotonic() - started:.1f}s)")
    return result.stdout


# ------------------------------------------------------------------ the API

# The aggregator is on loopback: never through a proxy the environment may name.
OPENER = build_opener(ProxyHandler({}))


def api(base, path, params=(), token=None):
    """GETs the JSON API; returns (status, body)."""
    url = f"{base}{path}" + (f"?{urlencode(list(params))}" if params else "")
    request = Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with OPENER.open(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"raw": body.decode("utf-8", "replace")}
    except URLError as e:
        raise Failure(f"GET {url}: {e.reason}") from None


def api_ok(base, path, params=(), token=None):
    status, body = api(base, path, params, token)
    if status != 200:
        raise Failure(f"GET {path}?{urlencode(list(params))} answered {status}: {body}")
    return body


# ------------------------------------------------------------------ the DOM


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children = []
        self.texts = []

    def text(self):
        return "".join(self.texts + [c.text() for c in self.children if isinstance(c, Node)]).strip()

    def all(self, predicate=lambda n: True):
        for child in self.children:
            if predicate(child):
                yield child
            yield from child.all(predicate)

    def find(self, predicate):
        return next(self.all(predicate), None)

    def hidden(self):
        """Whether the page hides this node: `hidden` on it or above, or inside <noscript>."""
        node = self
        while node is not None:
            if "hidden" in node.attrs or node.tag == "noscript":
                return True
            node = node.parent
        return False

    def __repr__(self):
        return f"<{self.tag} {self.attrs}>"


class Dom(HTMLParser):
    """The dumped DOM as a tree of Nodes (enough of HTML for Chromium's serialisation)."""

    def __init__(self, html):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.current = self.root
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.texts.append(data)

    def by_id(self, ident):
        return self.root.find(lambda n: n.attrs.get("id") == ident)


def need(condition, message):
    if not condition:
        raise Failure(message)


def same_number(shown, expected, what):
    """A data attribute holds the API's number exactly (JS prints the shortest round-trip form)."""
    need(shown is not None, f"{what}: no attribute on the page (expected {expected!r})")
    try:
        value = float(shown)
    except ValueError:
        raise Failure(f"{what}: {shown!r} on the page is not a number (expected {expected!r})") from None
    need(value == float(expected), f"{what}: the page shows {shown}, the API answers {expected!r}")


# ------------------------------------------------------------------ PNG


def png_pixels(path):
    """Decodes an 8-bit, non-interlaced RGB or RGBA PNG: (width, height, list of pixel tuples)."""
    with open(path, "rb") as f:
        data = f.read()
    need(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG")
    at, idat, header = 8, [], None
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        at += 12 + length
    width, height, depth, colour, _, _, interlace = header
    need(depth == 8 and colour in (2, 6) and interlace == 0,
         f"{path}: PNG of bit depth {depth}, colour type {colour}, interlace {interlace} is not decoded here")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    previous = bytearray(stride)
    pixels = []
    at = 0
    for _ in range(height):
        kind = raw[at]
        line = bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + predictor) & 255
        pixels.extend(bytes(line[i:i + 3]) for i in range(0, stride, channels))
        previous = line
    return width, height, pixels


def check_screenshot(path, size):
    width, height, pixels = png_pixels(path)
    need((width, height) == size, f"{path}: {width}x{height}, expected {size[0]}x{size[1]}")
    colours = Counter(pixels)
    background, count = colours.most_common(1)[0]
    share = 1 - count / len(pixels)
    need(len(colours) >= 32, f"{path}: only {len(colours)} distinct colours: a blank page?")
    need(share >= 0.15, f"{path}: only {share:.1%} of the pixels differ from the background #{background.hex()}")
    return f"{width}x{height}, {len(colours)} colours, {share:.0%} off the background"


# ------------------------------------------------------------------ the browser


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    JSON messages ended by NUL, commands on fd 3, answers and events on fd 4)."""

    def __init__(self, program, work):
        self.profile = os.path.join(work, "chromium-profile")
        to_chrome, self.commands = os.pipe()
        self.answers, from_chrome = os.pipe()

        def pipes():
            die_with_parent()
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        self.log_path = os.path.join(work, "chromium.log")
        self.log_file = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [program, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
             "--no-proxy-server", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=self.log_file, pass_fds=(3, 4),
            preexec_fn=pipes, env=child_env())
        os.close(to_chrome)
        os.close(from_chrome)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.loads = 0
        version = self.call("Browser.getVersion")
        self.version = version.get("product", "?")

    def call(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                    raise Failure(f"chromium did not answer {method} within {timeout}s")
                chunk = os.read(self.answers, 1 << 20)
                if not chunk:
                    raise Failure(f"chromium exited (during {method}):\n{tail(self.log_path)}")
                self.buffer += chunk
            raw, _, self.buffer = self.buffer.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") != self.next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise Failure(f"chromium: {method}: {reply['error'].get('message')}")
            return reply.get("result", {})

    def tab(self, size, mobile):
        return Tab(self, size, mobile)

    def close(self):
        if self.process.poll() is None:
            try:
                self.call("Browser.close", timeout=10)
            except Failure:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self.commands, self.answers):
            try:
                os.close(fd)
            except OSError:
                pass


class Tab:
    """One page of the browser, with its own window size and session storage."""

    def __init__(self, browser, size, mobile):
        self.browser, self.size, self.mobile = browser, size, mobile
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.resize(size)

    def call(self, method, params=None, timeout=60):
        return self.browser.call(method, params, self.session, timeout)

    def resize(self, size):
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": self.mobile})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise Failure(f"in the page, {expression!r} threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def exceptions(self):
        """Uncaught exceptions the page's scripts threw so far."""
        return [e["params"]["exceptionDetails"] for e in self.browser.events
                if e.get("sessionId") == self.session and e.get("method") == "Runtime.exceptionThrown"]

    def wait_ready(self, what, timeout=90):
        """Waits for <body data-state="ready"> in the current document; returns the DOM."""
        deadline = time.monotonic() + timeout
        probe = ("window.__checkOldDocument === undefined && document.readyState === 'complete'"
                 " && !!document.body && document.body.dataset.state === 'ready'")
        while not self.evaluate(probe):
            if time.monotonic() > deadline:
                state = self.evaluate("document.body ? document.body.dataset.state + ': ' + "
                                      "(document.getElementById('status') || {}).textContent : 'no body'")
                raise Failure(f"{what}: the page was not ready after {timeout}s ({state})")
            time.sleep(0.1)
        thrown = self.exceptions()
        need(not thrown, f"{what}: the page's script threw: {[e.get('exception', {}).get('description', e.get('text')) for e in thrown]}")
        dom = Dom(self.evaluate("document.documentElement.outerHTML"))
        return dom, dom.root.find(lambda n: n.tag == "body")

    def load(self, url, what):
        self.browser.loads += 1
        self.evaluate("window.__checkOldDocument = true")
        self.call("Page.navigate", {"url": url})
        return self.wait_ready(what)

    def act(self, script, what):
        """Runs `script` (a user's action, which starts a load) and waits for the page."""
        self.browser.loads += 1
        self.evaluate(script)
        return self.wait_ready(what)

    def screenshot(self, path, full_page):
        """A PNG of the window, or of the whole page at the window's width."""
        size = self.size
        if full_page:
            height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
            size = (self.size[0], max(self.size[1], height))
            self.resize(size)
            time.sleep(0.3)  # let the layout settle at the new height
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        if full_page:
            self.resize(self.size)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return check_screenshot(path, size)


# ------------------------------------------------------------------ checks of one view


def visible_errors(dom):
    return [n.text() for n in dom.root.all(lambda n: "error" in n.attrs.get("class", "").split())
            if not n.hidden() and n.text()]


def check_ready_without_errors(dom, body, what):
    errors = visible_errors(dom)
    need(not errors and body.attrs.get("data-errors") == "0",
         f"{what}: the page shows errors (data-errors={body.attrs.get('data-errors')}): {errors}")


def check_chart(dom, reply, grouping, what):
    box = dom.by_id("distinct-chart")
    need(box is not None, f"{what}: no #distinct-chart")
    svg = box.find(lambda n: n.tag == "svg")
    need(svg is not None, f"{what}: no <svg> in #distinct-chart")
    need(svg.attrs.get("data-grouping") == grouping,
         f"{what}: the chart is per {svg.attrs.get('data-grouping')}, expected per {grouping}")
    groups = reply["groups"]
    band = svg.find(lambda n: n.attrs.get("data-role") == "band")
    need(band is not None and band.tag == "path", f"{what}: no band path (data-role=band)")
    corners = band.attrs.get("d", "").count(",")
    need(corners == 2 * len(groups), f"{what}: the band has {corners} corners, expected 2 x {len(groups)} groups")
    line = svg.find(lambda n: n.attrs.get("data-role") == "line")
    need(line is not None and line.attrs.get("d", "").count(",") == len(groups),
         f"{what}: the line path does not have one vertex per group")
    points = list(svg.all(lambda n: n.attrs.get("data-role") == "point"))
    need(len(points) == len(groups), f"{what}: {len(points)} points on the chart, the API has {len(groups)} groups")
    for point, group in zip(points, groups):
        at = f"{what}: point {group['key']}"
        need(point.attrs.get("data-key") == group["key"], f"{at}: data-key {point.attrs.get('data-key')!r}")
        need(point.attrs.get("data-time") == group["time"],
             f"{at}: data-time {point.attrs.get('data-time')!r}, the API says {group['time']!r}")
        for attr, field in (("data-estimate", "estimate"), ("data-lower95", "lower95"),
                            ("data-upper95", "upper95"), ("data-std-error", "std_error")):
            same_number(point.attrs.get(attr), group["answer"][field], f"{at} {attr}")
        # A period the range cuts holds fewer hours: marked, with its hours, so that its
        # lower count does not read as a fall in traffic.
        length = 1 if grouping == "hour" else 24
        start = int(datetime.fromisoformat(group["time"].replace("Z", "+00:00")).timestamp()) // 3600
        hours = min(reply["range"]["end_hour"], start + length) - max(reply["range"]["start_hour"], start)
        need(point.attrs.get("data-hours") == str(hours),
             f"{at}: data-hours {point.attrs.get('data-hours')!r}, the range holds {hours} of its hours")
        need(("short" in point.attrs.get("class", "").split()) == (hours < length),
             f"{at}: class {point.attrs.get('class')!r} for a period of which the range holds {hours} of {length} hours")
    times = [g["time"] for g in groups]
    need(times == sorted(times), f"{what}: the API's groups are not in time order")
    title = svg.find(lambda n: n.attrs.get("data-role") == "y-title")
    need(title is not None and grouping in title.text(), f"{what}: the count axis has no title naming the {grouping}")
    return len(points)


def check_total(dom, reply, what):
    total = dom.by_id("distinct-total")
    need(total is not None, f"{what}: no #distinct-total")
    figure = total.find(lambda n: "data-estimate" in n.attrs)
    need(figure is not None, f"{what}: #distinct-total has no data-estimate")
    for attr, field in (("data-estimate", "estimate"), ("data-std-error", "std_error"),
                        ("data-lower95", "lower95"), ("data-upper95", "upper95")):
        same_number(figure.attrs.get(attr), reply["answer"][field], f"{what}: total {attr}")
    # Nothing stored and nothing missing is no data, never "every server reported".
    coverage = reply["coverage"]
    empty = coverage["sketches_merged"] == 0 and coverage["server_hours_missing"] == 0 \
        and coverage.get("partitions_missing", 0) == 0
    need(figure.attrs.get("data-state") == ("empty" if empty else "data"),
         f"{what}: the total is drawn {figure.attrs.get('data-state')!r} with {coverage['sketches_merged']} sketches merged")
    note = total.find(lambda n: "coverage-note" in n.attrs.get("class", "").split())
    need(note is not None, f"{what}: the total has no coverage note")
    if empty:
        need("reported every hour" not in note.text() and "no data" in note.text(),
             f"{what}: nothing was merged, yet the total's note says {note.text()!r}")
    return empty


def check_coverage(dom, daily, servers, what):
    grid = dom.by_id("coverage-grid")
    need(grid is not None, f"{what}: no #coverage-grid")
    cells = list(grid.all(lambda n: n.tag == "td" and "data-server" in n.attrs))
    shown = {(c.attrs["data-server"], c.attrs.get("data-day")): c.attrs for c in cells}
    need(len(shown) == len(cells), f"{what}: a server-day appears twice in the grid")
    names = {s["name"] for s in servers}
    # A server-day's missing hours, or None when the API does not say: `missing` names at
    # most 100 servers while `server_hours_missing` counts all, and partitions that did
    # not answer leave any server's day incomplete. Those cells must be "unknown".
    expected = {}
    empty_days = {}
    for group in daily["groups"]:
        day = group["key"] if len(group["key"]) == 10 else group["time"][:10]
        coverage = group["coverage"]
        missing = {m["server"]: m["hours"] for m in coverage["missing"]}
        unknown = (sum(missing.values()) < coverage["server_hours_missing"]
                   or coverage.get("partitions_missing", 0) > 0)
        empty = coverage["sketches_merged"] == 0
        for name in names | set(missing):
            expected[(name, day)] = missing.get(name, None if unknown else 0)
            empty_days[(name, day)] = empty
    need(set(shown) == set(expected),
         f"{what}: grid cells {sorted(set(shown) ^ set(expected))[:6]}... differ from servers x days of the API")
    for key, hours in expected.items():
        attrs = shown[key]
        if hours is None:
            need(attrs.get("data-level") == "unknown" and "data-missing" not in attrs,
                 f"{what}: cell {key} is {attrs.get('data-level')} with {attrs.get('data-missing')} missing hours, "
                 "but the API does not say (the server is not named and not every missing hour is, or "
                 "partitions did not answer): it must be unknown")
        else:
            need(attrs.get("data-missing") is not None and int(attrs["data-missing"]) == hours,
                 f"{what}: cell {key} shows {attrs.get('data-missing')} missing hours, the API says {hours}")
            need(attrs.get("data-level") != "unknown", f"{what}: cell {key} is unknown, the API says {hours} hours")
            # No hour missing is "ok" only where something was stored: a day with nothing
            # merged and nothing missing is "none" (no server reported), not complete.
            level = "none" if hours == 0 and empty_days[key] else "ok" if hours == 0 else None
            need((attrs.get("data-level") in ("ok", "none")) == (hours == 0)
                 and (level is None or attrs.get("data-level") == level),
                 f"{what}: cell {key} is {attrs.get('data-level')} with {hours} missing hours "
                 f"({'nothing' if empty_days[key] else 'something'} merged that day)")
    legend = dom.by_id("coverage-legend")
    need(legend is not None and len(list(legend.all(lambda n: n.tag == "li"))) >= 4, f"{what}: no legend")
    return len(cells), sum(h for h in expected.values() if h is not None)


def check_topk(dom, reply, what):
    table = dom.by_id("topk-table")
    need(table is not None, f"{what}: no #topk-table")
    rows = list(table.all(lambda n: n.tag == "tr" and "data-rank" in n.attrs))
    items = reply["items"]
    need(len(rows) == len(items) > 0, f"{what}: {len(rows)} top-K rows, the API has {len(items)} items")
    for rank, (row, item) in enumerate(zip(rows, items), start=1):
        need(row.attrs.get("data-rank") == str(rank), f"{what}: row {rank} has data-rank {row.attrs.get('data-rank')}")
        for field, attr in (("item", "data-item"), ("item_base64", "data-item-base64")):
            need(row.attrs.get(attr) == item.get(field),
                 f"{what}: row {rank} {attr} is {row.attrs.get(attr)!r}, the API's {field} is {item.get(field)!r}")
        for field in ("estimate", "lower", "upper"):
            same_number(row.attrs.get(f"data-{field}"), item[field], f"{what}: row {rank} {field}")
    return len(rows)


def check_membership(dom, item, reply, what):
    result = dom.by_id("member-result")
    need(result is not None, f"{what}: no #member-result")
    answer = result.find(lambda n: "data-maybe-present" in n.attrs)
    need(answer is not None, f"{what}: no membership answer for {item!r}")
    a = reply["answer"]
    need(answer.attrs.get("data-item") == item, f"{what}: the answer is for {answer.attrs.get('data-item')!r}")
    need(answer.attrs["data-maybe-present"] == str(a["maybe_present"]).lower(),
         f"{what}: maybe-present {answer.attrs['data-maybe-present']}, the API says {a['maybe_present']}")
    need(answer.attrs.get("data-past-design-point") == str(a["past_design_point"]).lower(),
         f"{what}: past-design-point {answer.attrs.get('data-past-design-point')}, the API says {a['past_design_point']}")
    same_number(answer.attrs.get("data-estimated-fpr"), a["estimated_fpr"], f"{what}: estimated fpr")
    same_number(answer.attrs.get("data-fill-ratio"), a["fill_ratio"], f"{what}: fill ratio")
    for field in ("filters_consulted", "range_fpr", "all_false_probability", "seen_in_count", "saturated_filters"):
        same_number(answer.attrs.get("data-" + field.replace("_", "-")), a[field], f"{what}: {field}")
    need(answer.attrs.get("data-definitely-absent") == str(a["definitely_absent"]).lower(),
         f"{what}: definitely-absent {answer.attrs.get('data-definitely-absent')}, the API says {a['definitely_absent']}")
    # Where it was seen: one row per span of a server's consecutive filters the API lists,
    # in its order, with their hours summed and the highest of their rates.
    spans = []
    for seen in a["seen_in"]:
        last = spans[-1] if spans else None
        if last and last["server"] == seen["server"] and last["start_hour"] + last["hours"] == seen["start_hour"]:
            last["hours"] += seen["hours"]
            last["filters"] += 1
            last["fpr_high"] = max(last["fpr_high"], seen["fpr"])
        else:
            spans.append({"server": seen["server"], "start_hour": seen["start_hour"], "hours": seen["hours"],
                          "filters": 1, "fpr_high": seen["fpr"]})
    rows = list(result.all(lambda n: n.tag == "tr" and "data-server" in n.attrs))
    need(len(rows) == len(spans),
         f"{what}: {len(rows)} 'seen in' rows, the API's {len(a['seen_in'])} filters make {len(spans)} spans")
    for row, span in zip(rows, spans):
        need(row.attrs["data-server"] == span["server"],
             f"{what}: a 'seen in' row names {row.attrs['data-server']!r}, the API {span['server']!r}")
        for field in ("start_hour", "hours", "filters", "fpr_high"):
            same_number(row.attrs.get("data-" + field.replace("_", "-")), span[field], f"{what}: seen in {field}")
    coverage = reply["coverage"]
    complete = coverage["server_hours_missing"] == 0 and coverage.get("partitions_missing", 0) == 0
    certain = not a["maybe_present"] and complete
    need(answer.attrs.get("data-certain") == str(certain).lower(),
         f"{what}: 'absent' certain={answer.attrs.get('data-certain')}, but maybe_present={a['maybe_present']} and "
         f"the coverage is {'complete' if complete else 'incomplete'}")
    # The coverage note speaks of the verdict shown: never of "absent" under a "maybe".
    note = result.find(lambda n: "coverage-note" in n.attrs.get("class", "").split())
    need((note is not None) == (not complete), f"{what}: the coverage note is "
         f"{'shown' if note is not None else 'missing'} while the coverage is {'complete' if complete else 'incomplete'}")
    if note is not None and a["maybe_present"]:
        need("absent" not in note.text(), f"{what}: under a 'maybe' verdict the note says {note.text()!r}")
    warning = dom.by_id("member-warning")
    need((warning is not None) == a["past_design_point"], f"{what}: the past-design-point warning is "
         f"{'shown' if warning is not None else 'missing'} while the API says {a['past_design_point']}")
    return "maybe present" if a["maybe_present"] else "absent"


def check_servers(dom, servers, what):
    table = dom.by_id("servers-table")
    need(table is not None, f"{what}: no #servers-table")
    rows = [r.attrs["data-server"] for r in table.all(lambda n: n.tag == "tr" and "data-server" in n.attrs)]
    need(rows == [s["name"] for s in servers], f"{what}: servers {rows}, the API lists {[s['name'] for s in servers]}")
    for server in servers:
        row = table.find(lambda n: n.tag == "tr" and n.attrs.get("data-server") == server["name"])
        chips = sorted(c.attrs["data-label"] for c in row.all(lambda n: "data-label" in n.attrs))
        need(chips == sorted(f"{k}={v}" for k, v in server["labels"].items()),
             f"{what}: labels of {server['name']} shown as {chips}, the API says {server['labels']}")


# ------------------------------------------------------------------ the scenario


def simulate_week(hourglass, grpc, work, start):
    """Four agents, a week from `start`; web-4 down for GAP_HOURS hours from GAP_START."""
    agents = []
    try:
        for name, region in SERVERS:
            agents.append(Service(name, [
                hourglass, "agent", "--server-name", name, "--label", f"region={region}", "--label", "role=web",
                "--aggregator", f"http://{grpc}", "--statsd-listen", "off", "--ingest-listen", "127.0.0.1:0",
                "--admin-listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "agents", name),
                "--lateness", "9d", "--flush-interval", "2s", "--default-kinds", "distinct,frequency,membership",
            ], ["ingest", "admin"], os.path.join(work, f"{name}.log")))
        ingest = [f"http://{a.addrs['ingest']}" for a in agents]
        hours = 7 * 24
        parts = [(0, GAP_START, ingest), (GAP_START, GAP_HOURS, ingest[:3]),
                 (GAP_START + GAP_HOURS, hours - GAP_START - GAP_HOURS, ingest)]
        for offset, count, targets in parts:
            first = (start + timedelta(hours=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")
            run([hourglass, "simulate", "--agents", ",".join(targets), "--start", first, "--hours", str(count),
                 "--events-per-hour", str(EVENTS_PER_HOUR), "--seed", "7"],
                f"simulate {count} hours from {first} to {len(targets)} agents")
        for agent in agents:
            agent.stop(expect_clean=True)  # SIGTERM: a final flush of what it holds
    finally:
        for agent in agents:
            agent.stop()


def settled(base, queries, what, token=None, timeout=90):
    """The answers to `queries`, once two readings 3 s apart agree (rollups built)."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        now = {name: api_ok(base, path, params, token) for name, (path, params) in queries.items()}
        if now == previous:
            return now
        if time.monotonic() > deadline:
            raise Failure(f"{what}: the API's answers kept changing for {timeout}s")
        previous = now
        time.sleep(3)


def check_view(load, base, queries, what, checks, token=None):
    """Loads a view with `load()` and runs `checks(dom, body, answers)` on it, with the API's
    answers read just before and just after; if they changed meanwhile (a rollup landed),
    the view is loaded again."""
    for _ in range(3):
        before = settled(base, queries, what, token)
        dom, body = load()
        after = {name: api_ok(base, path, params, token) for name, (path, params) in queries.items()}
        if before == after:
            return checks(dom, body, before)
        log(f"{what}: the API's answers changed while the page loaded; again")
    raise Failure(f"{what}: the API's answers kept changing")


def view_url(base, params):
    return f"{base}/?{urlencode(params)}"


def start_aggregator(binary, work, data, config_text, name, env=None):
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write(config_text)
    return Service(name, [
        binary, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
        "--data-dir", data, "--config", config,
    ], ["grpc", "admin", "http"], os.path.join(work, f"{name}.log"), env=env)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="directory with hourglass and hourglass-aggregator")
    parser.add_argument("--chromium", required=True, help="the chromium program")
    parser.add_argument("--screenshot-to", help="save the desktop screenshot here (e.g. docs/dashboard.png)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, screenshots)")
    args = parser.parse_args()
    # A SIGTERM ends the run like a failure would: the finally below stops every service.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    hourglass = os.path.join(args.bin_dir, "hourglass")
    aggregator_bin = os.path.join(args.bin_dir, "hourglass-aggregator")
    for binary in (hourglass, aggregator_bin):
        if not os.access(binary, os.X_OK):
            print(f"FAIL - no executable {binary}", flush=True)
            return 1
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="hourglass-dashboard-")
    services = []
    browser = None
    results = []

    def ok(line):
        results.append(line)
        print(f"ok   - {line}", flush=True)

    try:
        # ---- a week of data from four servers, web-4 down for six hours
        rollups = '[rollup]\ninterval = "2s"\n'
        data = os.path.join(work, "aggregator")
        aggregator = start_aggregator(aggregator_bin, work, data, rollups, "aggregator")
        services.append(aggregator)
        base = f"http://{aggregator.addrs['http']}"
        log(f"aggregator: gRPC {aggregator.addrs['grpc']}, HTTP {base}")
        today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        start = today - timedelta(days=7)
        t = time.monotonic()
        simulate_week(hourglass, aggregator.addrs["grpc"], work, start)
        ok(f"a week of traffic from {len(SERVERS)} agents, web-4 down {GAP_HOURS} hours "
           f"({time.monotonic() - t:.0f}s)")
        servers = api_ok(base, "/api/v1/servers")["servers"]
        need([s["name"] for s in servers] == [n for n, _ in SERVERS], f"the aggregator lists servers {servers}")
        series = api_ok(base, "/api/v1/series")["series"]
        kinds = {(s["metric"], s["kind"]) for s in series}
        for metric in ("visitors", "pages"):
            for kind in ("distinct", "frequency", "membership"):
                need((metric, kind) in kinds, f"no {kind} series of {metric}: {series}")

        browser = Chromium(args.chromium, work)
        log(f"browser: {browser.version}")
        week = [("from", start.strftime("%Y-%m-%d")), ("to", today.strftime("%Y-%m-%d"))]

        # ---- visitors per hour, desktop
        item = "user0"
        sel = [("metric", "visitors"), *week]
        queries = {
            "hourly": ("/api/v1/distinct", sel + [("group_by", "hour")]),
            "daily": ("/api/v1/distinct", sel + [("group_by", "day")]),
            "topk": ("/api/v1/topk", sel + [("k", "10")]),
            "member": ("/api/v1/membership", sel + [("item", item)]),
        }
        desktop = browser.tab(DESKTOP, mobile=False)
        url = view_url(base, sel + [("group_by", "hour"), ("item", item)])

        def desktop_checks(dom, body, a):
            what = "visitors per hour, 1280x900"
            check_ready_without_errors(dom, body, what)
            need(a["hourly"]["range"]["end_hour"] - a["hourly"]["range"]["start_hour"] == 168,
                 f"{what}: the API's range is {a['hourly']['range']}, not the week")
            points = check_chart(dom, a["hourly"], "hour", what)
            check_total(dom, a["hourly"], what)
            cells, missing = check_coverage(dom, a["daily"], servers, what)
            gap = [m for g in a["daily"]["groups"] for m in g["coverage"]["missing"]]
            need(gap == [{"server": "web-4", "hours": GAP_HOURS}],
                 f"{what}: the scenario should leave web-4 {GAP_HOURS} hours missing; the API says {gap}")
            rows = check_topk(dom, a["topk"], what)
            member = check_membership(dom, item, a["member"], what)
            check_servers(dom, servers, what)
            return (f"{what}: {points} points with their band and line, the total, {cells} coverage cells "
                    f"({missing} server-hours missing), {rows} top-K rows, {item} {member}, "
                    f"{len(servers)} servers: all equal to the API's answers")

        ok(check_view(lambda: desktop.load(url, "visitors per hour"), base, queries, "visitors per hour",
                      desktop_checks))
        desktop_png = os.path.join(work, "desktop.png")
        ok(f"desktop screenshot (whole page): {desktop.screenshot(desktop_png, full_page=True)}")

        # The user switches to days: the URL says so and the chart follows.
        def per_day_checks(dom, body, a):
            what = "switched to per day"
            check_ready_without_errors(dom, body, what)
            search = desktop.evaluate("location.search")
            need("group_by=day" in search, f"{what}: the URL is ?{search}, without group_by=day")
            points = check_chart(dom, a["daily"], "day", what)
            check_total(dom, a["daily"], what)
            return f"{what}: the URL holds group_by=day and the chart its {points} days"

        switch = ("document.getElementById('group-by').value = 'day';"
                  "document.getElementById('group-by').dispatchEvent(new Event('change'))")
        ok(check_view(lambda: desktop.act(switch, "switched to per day"), base,
                      {"daily": queries["daily"]}, "switched to per day", per_day_checks))

        # ---- pages, auto (a week: per day), phone
        item = "/nowhere"
        sel = [("metric", "pages"), *week]
        queries = {
            "daily": ("/api/v1/distinct", sel + [("group_by", "day")]),
            "topk": ("/api/v1/topk", sel + [("k", "5")]),
            "member": ("/api/v1/membership", sel + [("item", item)]),
        }
        phone = browser.tab(PHONE, mobile=True)
        url = view_url(base, sel + [("k", "5"), ("item", item)])

        def phone_checks(dom, body, a):
            what = "pages per day (auto), 390x844 phone"
            check_ready_without_errors(dom, body, what)
            points = check_chart(dom, a["daily"], "day", what)
            need(points == 7, f"{what}: {points} days on the chart, expected 7")
            width = int(dom.by_id("distinct-chart").find(lambda n: n.tag == "svg").attrs.get("width", "0"))
            need(width <= PHONE[0], f"{what}: the chart is {width}px wide on a {PHONE[0]}px screen")
            overflow = phone.evaluate("document.documentElement.scrollWidth")
            need(overflow <= PHONE[0], f"{what}: the page is {overflow}px wide on a {PHONE[0]}px screen")
            # A finger on the chart reads out the point under it, as hovering does.
            readout = phone.evaluate(
                "(() => { const svg = document.querySelector('#distinct-chart svg');"
                " const r = svg.getBoundingClientRect();"
                " svg.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true, pointerType: 'touch',"
                " clientX: r.left + r.width / 2, clientY: r.top + r.height / 2}));"
                " return document.getElementById('chart-readout').textContent; })()")
            need(readout and "95%" in readout, f"{what}: a touch on the chart reads out {readout!r}")
            check_total(dom, a["daily"], what)
            cells, _ = check_coverage(dom, a["daily"], servers, what)
            rows = check_topk(dom, a["topk"], what)
            member = check_membership(dom, item, a["member"], what)
            need(member == "absent", f"{what}: {item} was never sent but the filter says {member}")
            return (f"{what}: {points} points, a {width}px chart, no sideways scrolling, the total, "
                    f"{cells} coverage cells, {rows} top-K rows, {item} {member}")

        ok(check_view(lambda: phone.load(url, "pages per day"), base, queries, "pages per day", phone_checks))
        ok(f"phone screenshot (whole page): {phone.screenshot(os.path.join(work, 'phone.png'), full_page=True)}")

        # ---- where a "maybe" was seen, on a phone: spans, and the table within its card
        item = "user0"
        sel = [("metric", "visitors"), *week]
        queries = {"member": ("/api/v1/membership", sel + [("item", item)])}

        def phone_member_checks(dom, body, a):
            what = f"{item} looked up on a 390x844 phone"
            check_ready_without_errors(dom, body, what)
            member = check_membership(dom, item, a["member"], what)
            need(member == "maybe present", f"{what}: {item} is sent every hour, yet the filter says {member}")
            spans = len(list(dom.by_id("member-seen").all(lambda n: n.tag == "tr" and "data-server" in n.attrs)))
            need(spans < len(a["member"]["answer"]["seen_in"]),
                 f"{what}: {spans} rows for {len(a['member']['answer']['seen_in'])} filters of consecutive hours")
            fits = phone.evaluate(
                "(() => { const t = document.getElementById('member-seen').getBoundingClientRect();"
                " const c = document.getElementById('member-result').getBoundingClientRect();"
                " return t.left >= c.left - 0.5 && t.right <= c.right + 0.5; })()")
            need(fits, f"{what}: the 'seen in' table runs out of its card")
            overflow = phone.evaluate("document.documentElement.scrollWidth")
            need(overflow <= PHONE[0], f"{what}: the page is {overflow}px wide on a {PHONE[0]}px screen")
            return f"{what}: {spans} spans for {len(a['member']['answer']['seen_in'])} filters, within the card"

        ok(check_view(lambda: phone.load(view_url(base, sel + [("item", item)]), f"{item} on a phone"), base, queries,
                      f"{item} looked up on a phone", phone_member_checks))

        # ---- a range that cuts its first and last days: those are marked partial
        cut = [("from", (start + timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M:%SZ")),
               ("to", (today - timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"))]
        sel = [("metric", "visitors"), *cut, ("group_by", "day")]
        queries = {"daily": ("/api/v1/distinct", sel)}

        def partial_checks(dom, body, a):
            what = "a range that cuts its first and last days"
            check_ready_without_errors(dom, body, what)
            points = check_chart(dom, a["daily"], "day", what)
            svg = dom.by_id("distinct-chart").find(lambda n: n.tag == "svg")
            short = [p.attrs.get("data-hours") for p in svg.all(lambda n: n.attrs.get("data-role") == "point")
                     if "short" in p.attrs.get("class", "").split()]
            need(short == ["12", "18"], f"{what}: partial days {short}, expected the first (12 h) and the last (18 h)")
            need(svg.find(lambda n: n.attrs.get("data-role") == "line-partial") is not None,
                 f"{what}: no dashed segment to the partial days")
            return f"{what}: {points} days, the first (12 h) and the last (18 h) marked partial"

        ok(check_view(lambda: desktop.load(view_url(base, sel), "a range cutting its days"), base, queries,
                      "a range that cuts its first and last days", partial_checks))

        # ---- a week before any server existed: no data, not a complete zero
        before = [("from", (start - timedelta(days=14)).strftime("%Y-%m-%d")),
                  ("to", (start - timedelta(days=7)).strftime("%Y-%m-%d"))]
        sel = [("metric", "visitors"), *before]
        queries = {"daily": ("/api/v1/distinct", sel + [("group_by", "day")])}

        def empty_checks(dom, body, a):
            what = "a week before any server existed"
            check_ready_without_errors(dom, body, what)
            coverage = a["daily"]["coverage"]
            need(coverage["sketches_merged"] == 0 and coverage["server_hours_missing"] == 0,
                 f"{what}: the premise is nothing merged and nothing missing; the API says {coverage}")
            need(check_total(dom, a["daily"], what), f"{what}: the total is not drawn as no data")
            cells, _ = check_coverage(dom, a["daily"], servers, what)
            summary = dom.by_id("coverage-summary")
            need(summary is not None and "no data" in summary.text(),
                 f"{what}: the coverage summary says {summary.text() if summary else None!r}")
            return f"{what}: the total says no data and its {cells} coverage cells are 'none', not complete"

        ok(check_view(lambda: desktop.load(view_url(base, sel), "a week before any server existed"), base, queries,
                      "a week before any server existed", empty_checks))

        # ---- an error from the API, shown as the API says it
        sel = [("metric", "no-such-metric"), *week]
        status, body = api(base, "/api/v1/distinct", sel)
        need(400 <= status < 500 and "error" in body and body["error"].get("message"),
             f"an unknown metric should be a 4xx with an error message; the API answered {status}: {body}")
        dom, page = desktop.load(view_url(base, sel), "an unknown metric")
        errors = visible_errors(dom)
        need(page.attrs.get("data-errors", "0") != "0" and any(body["error"]["message"] in e for e in errors),
             f"an unknown metric: the page should show {body['error']['message']!r}; it shows {errors}")
        ok(f"an unknown metric: the page shows the API's message ({status} {body['error']['code']})")

        # ---- the same data behind a token
        aggregator.stop(expect_clean=True)
        services.remove(aggregator)
        secret = "dashboard-" + os.urandom(8).hex()
        guarded = start_aggregator(
            aggregator_bin, work, data,
            rollups + f'\n[[auth.tokens]]\nname = "dashboard-test"\nrole = "query"\nenv = "{TOKEN_ENV}"\n',
            "aggregator-with-token", env={TOKEN_ENV: secret})
        services.append(guarded)
        base = f"http://{guarded.addrs['http']}"
        status, body = api(base, "/api/v1/series")
        need(status == 401, f"with tokens, /api/v1/series without one answered {status}: {body}")
        sel = [("metric", "visitors"), *week]
        url = view_url(base, sel)
        tab = browser.tab(DESKTOP, mobile=False)
        dom, page = tab.load(url, "no token")
        auth = dom.by_id("auth")
        need(auth is not None and not auth.hidden() and dom.by_id("token") is not None,
             "with tokens, the page loaded without one should show the token box (#auth)")
        need(auth.attrs.get("data-reason") == "missing", f"the token box says {auth.attrs.get('data-reason')!r}")
        ok("an aggregator with tokens: the page asks for one")

        def with_token_checks(dom, body, a):
            what = "the token typed in"
            check_ready_without_errors(dom, body, what)
            need(dom.by_id("auth").hidden(), f"{what}: the token box is still shown")
            check_total(dom, a["daily"], what)
            kept = tab.evaluate("sessionStorage.getItem('hourglass.token')")
            need(kept == secret, f"{what}: session storage holds {kept!r}")
            need(secret not in tab.evaluate("location.href"), f"{what}: the token is in the URL")
            return f"{what}: kept in session storage (not in the URL), sent, and the page answers"

        typed = (f"document.getElementById('token').value = {json.dumps(secret)};"
                 "document.getElementById('auth-form').requestSubmit()")
        ok(check_view(lambda: tab.act(typed, "the token typed in"), base,
                      {"daily": ("/api/v1/distinct", sel + [("group_by", "day")])}, "the token typed in",
                      with_token_checks, token=secret))
        tab.evaluate("sessionStorage.setItem('hourglass.token', 'not-the-token')")
        dom, page = tab.load(url, "a wrong token")
        auth = dom.by_id("auth")
        need(not auth.hidden() and auth.attrs.get("data-reason") == "refused",
             f"a wrong token: the token box should say it was refused (hidden={auth.hidden()}, "
             f"reason={auth.attrs.get('data-reason')!r})")
        ok("a wrong token: the page says it was refused and asks again")
        guarded.stop(expect_clean=True)
        services.remove(guarded)

        if args.screenshot_to:
            os.makedirs(os.path.dirname(os.path.abspath(args.screenshot_to)), exist_ok=True)
            shutil.copyfile(desktop_png, args.screenshot_to)
            ok(f"desktop screenshot saved to {args.screenshot_to}")
        print(f"check-dashboard: passed: {len(results)} checks, {browser.loads} page loads, "
              f"in {time.monotonic() - started:.0f}s", flush=True)
    except Failure as failure:
        print(f"FAIL - {failure}", flush=True)
        print(f"(logs and screenshots kept in {work})", flush=True)
        args.keep = True
        return 1
    finally:
        if browser is not None:
            browser.close()
        for service in services:
            service.stop()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
