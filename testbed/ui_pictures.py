"""Pictures of the real Temporal Web UI, taken with headless Chromium (Debian's
``chromium`` package: ``make ui-pictures`` installs it when absent).

Chromium is started so that nothing leaves the machine: every host name resolves to
nothing but loopback (``--host-resolver-rules``), background networking, component
updates and sync are off, and the profile is a fresh temporary directory.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import websocket

CHROMIUM = "/usr/bin/chromium"


def capture(
    url: str, out: Path, *, width: int = 1500, height: int = 1000, wait_s: float = 8.0
) -> Path:
    """Screenshot of ``url`` (a loopback address) after ``wait_s`` seconds of real time.

    Through the DevTools protocol, not ``--screenshot``: the UI's workflow page keeps a
    long poll open, and Chromium's virtual time never advances while a request is pending."""
    host = urllib.parse.urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"only loopback pages are photographed, not {host!r}")
    exe = shutil.which("chromium") or CHROMIUM
    out.parent.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with tempfile.TemporaryDirectory(
        prefix="retire-chromium-", ignore_cleanup_errors=True
    ) as profile:
        browser = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--remote-debugging-address=127.0.0.1",
                f"--remote-debugging-port={port}",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            page = _new_page(port, url)
            time.sleep(wait_s)
            ws = websocket.create_connection(page, timeout=30, suppress_origin=True)
            try:
                ws.send(
                    json.dumps(
                        {"id": 1, "method": "Page.captureScreenshot", "params": {"format": "png"}}
                    )
                )
                while True:
                    answer = json.loads(ws.recv())
                    if answer.get("id") == 1:
                        break
            finally:
                ws.close()
            out.write_bytes(base64.b64decode(answer["result"]["data"]))
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _new_page(port: int, url: str) -> str:
    """Open ``url`` in a new tab; its DevTools websocket address."""
    end = time.monotonic() + 30
    while True:
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/json/new?{urllib.parse.quote(url, safe='')}",
                method="PUT",
            )
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(req, timeout=5) as r:
                target: str = json.loads(r.read())["webSocketDebuggerUrl"]
                return target
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def workflow_url(ui: str, workflow_id: str, *, namespace: str = "default") -> str:
    """The UI page of one workflow."""
    return f"{ui}/namespaces/{namespace}/workflows/{urllib.parse.quote(workflow_id, safe='')}"


def list_url(ui: str, query: str, *, namespace: str = "default") -> str:
    """The UI's workflow list filtered by a visibility ``query``."""
    return f"{ui}/namespaces/{namespace}/workflows?query={urllib.parse.quote(query)}"


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.ui_pictures --ui URL --out DIR [--workflow ID]... [--query Q]``."""
    p = argparse.ArgumentParser(prog="ui-pictures", description=__doc__)
    p.add_argument("--ui", required=True, help="the Web UI, e.g. http://127.0.0.1:8233")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workflow", action="append", default=[], metavar="ID")
    p.add_argument("--query", default="WorkflowType = 'Retirement'")
    a = p.parse_args(argv)
    print(capture(list_url(a.ui, a.query), a.out / "ui-list.png"))
    for wid in a.workflow:
        name = wid.replace("/", "-")
        print(capture(workflow_url(a.ui, wid), a.out / f"ui-{name}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
