"""A real headless Chromium driven through the DevTools protocol, for the HTML report's tests.

Why the protocol and not ``--dump-dom``/``--enable-logging``: one load of the page answers every
question at once and exactly — each network request the page makes (``Network.requestWillBeSent``),
each uncaught exception and console error (``Runtime.exceptionThrown``, ``Runtime.consoleAPICalled``,
``Log.entryAdded``), the DOM after the page's script ran (``Runtime.evaluate``), a click, and a
screenshot (``Page.captureScreenshot``) — where log scraping depends on Chromium's log format.

The WebSocket client is the few lines of RFC 6455 the protocol needs (text frames, masked from the
client), so the tests need no extra package. :func:`png_pixels` decodes the screenshot (8-bit RGB or
RGBA, all five filters) for the "not blank" check.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--disable-dev-shm-usage")


class WebSocket:
    """A minimal blocking WebSocket client (text frames only)."""

    def __init__(self, url: str, timeout: float = 30.0):
        match = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert match, url
        host, port, path = match.group(1), int(match.group(2)), match.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def send(self, text: str) -> None:
        data = text.encode()
        header = bytes([0x81])
        length = len(data)
        if length < 126:
            header += bytes([0x80 | length])
        elif length < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", length)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", length)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(data)))

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(length)
            message += payload
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """One headless Chromium with one page, and what that page did."""

    def __init__(self, width: int = 1280, height: int = 2000):
        assert CHROMIUM, "chromium is not installed"
        self.profile = tempfile.mkdtemp(prefix="stepscope-chromium-")
        # Chromium's own temporary files (its singleton socket's directory) go inside the profile, which
        # is removed with it: in the system's temporary directory, a killed browser leaves them behind
        scratch = os.path.join(self.profile, "tmp")
        os.mkdir(scratch)
        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "TMPDIR": scratch})
        try:
            self._connect()
        except BaseException:
            self._kill_group()  # a Chromium that started too late must not outlive the test run
            raise

    def _kill_group(self) -> None:
        """The launcher script and every Chromium process it started (one session)."""
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _connect(self) -> None:
        port = self._port()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                    pages = [item for item in json.load(answer) if item.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Chromium did not open a page")
            time.sleep(0.2)
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable")

    def _port(self) -> int:
        assert self.process.stderr is not None
        deadline = time.monotonic() + 90  # a crowded machine (the parallel test part) starts it slowly
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                return int(match.group(1))
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError("Chromium did not start its DevTools endpoint")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            if "method" in message:
                self.events.append(message)

    def open(self, path: Path, fragment: str = "", scripted: bool = True) -> None:
        """Load ``path`` from file:// and wait until its script marked the page ready (or 15 s);
        a page without a script (``scripted=False``) is ready once loaded."""
        self.call("Page.navigate", url="about:blank")  # a new document even when only the hash differs
        deadline = time.monotonic() + 15
        while self.evaluate("location.href") != "about:blank" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri() + fragment)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.evaluate("document.readyState") == "complete" and (not scripted or self.evaluate(
                    "document.documentElement.getAttribute('data-ready')") == "1"):
                return
            time.sleep(0.1)
        raise AssertionError("the page's script never finished (data-ready not set)")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and error log entries since the last :meth:`open`."""
        out = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", "")[:500])
        return out

    def requests(self) -> list[str]:
        """URLs the page requested since the last :meth:`open`."""
        return [event["params"]["request"]["url"] for event in self.events
                if event["method"] == "Network.requestWillBeSent"]

    def screenshot(self, scale: float = 1.0) -> bytes:
        """A PNG of the viewport (``scale`` < 1 makes a small one, quick to decode)."""
        size = self.evaluate("[window.innerWidth, window.innerHeight]")
        clip = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": scale}
        data = self.call("Page.captureScreenshot", format="png", clip=clip)["data"]
        return base64.b64decode(data)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self._kill_group()


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """``(width, height, rows)`` of an 8-bit RGB/RGBA PNG, rows unfiltered (bytes per row = width × channels)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat, header = 8, b"", b""
    while position < len(png):
        length = struct.unpack(">I", png[position:position + 4])[0]
        kind = png[position + 4:position + 8]
        data = png[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = data
        elif kind == b"IDAT":
            idat += data
        position += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    channels = 3 if color == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows: list[bytes] = []
    previous = bytearray(stride)
    for index in range(height):
        kind = raw[index * (stride + 1)]
        line = bytearray(raw[index * (stride + 1) + 1:(index + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows
