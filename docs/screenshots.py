"""Build the site and photograph three pages in headless Chromium: the home page, a tutorial and a Python API page.

    python docs/screenshots.py                 # -> docs/screenshots/{home,tutorial,api}.png (not in git)
    python docs/screenshots.py --out /tmp/shots --width 1280 --height 2000

Needs the docs extra (``pip install -e '.[docs]'``) and Debian's ``chromium`` (``apt-get install chromium``). The
site is served by ``python -m http.server`` on 127.0.0.1 (search and navigation work as they do online); Chromium
runs with a fresh profile and without network services of its own. CI builds the site (``mkdocs build --strict``);
this is the look a person takes before calling a change of the site done.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name -> the page's path in the site
PAGES = {
    "home": "",
    "tutorial": "tutorials/serve/",
    "api": "reference/python/adapters/",
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def build_site(site: Path) -> None:
    """``mkdocs build --strict`` into ``site``."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO, env=env,
                   check=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(site: Path, port: int) -> subprocess.Popen:
    """``python -m http.server`` on 127.0.0.1:port over ``site``, once it answers."""
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the site's server did not start")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise SystemExit("chromium is not installed: apt-get install chromium")
    return found


def screenshot(browser: str, url: str, out: Path, width: int, height: int) -> None:
    """One page as a PNG, in a fresh profile."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        "--virtual-time-budget=5000", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=120)
    if not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(f"no screenshot of {url}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="folder of the PNGs")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2000)
    args = parser.parse_args(argv)
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnft-site-") as site:
        build_site(Path(site))
        port = free_port()
        server = serve(Path(site), port)
        try:
            for name, path in PAGES.items():
                out = args.out / f"{name}.png"
                screenshot(browser, f"http://127.0.0.1:{port}/{path}", out, args.width, args.height)
                print(out)
        finally:
            server.terminate()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
