"""`make docs`'s site, built here and opened in headless Chromium: every page renders, every internal link
and anchor resolves, nothing is fetched from outside, and search finds a configuration key."""

from __future__ import annotations

import asyncio
import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest

from ._browser import browser_page
from ._docsgen import REPO

pytestmark = pytest.mark.timeout(240)

_PAGE = """(() => ({
  h1: (document.querySelector("article h1") || {textContent: ""}).textContent.trim(),
  text: (document.querySelector("article") || {innerText: ""}).innerText.length,
  links: [...document.querySelectorAll("a[href]")].map(a => a.href),
  ids: [...document.querySelectorAll("[id]")].map(e => e.id),
  external: [...document.querySelectorAll("script[src], link[href][rel=stylesheet], img[src]")]
    .map(e => e.src || e.href).filter(u => !u.startsWith(location.origin)),
}))()"""

_SEARCH = """(async (query) => {
  const input = document.querySelector("input[data-md-component=search-query]");
  for (let i = 0; i < 300; i++) {
    if (i % 10 === 0) {  // (re)type the query: the first keystrokes may come before the index is loaded
      input.focus();
      input.value = query;
      input.dispatchEvent(new Event("input", {bubbles: true}));
      input.dispatchEvent(new KeyboardEvent("keyup", {bubbles: true, key: "d"}));
    }
    const hits = [...document.querySelectorAll(".md-search-result__item a")].map(a => a.href);
    if (hits.length) return hits;
    await new Promise(r => setTimeout(r, 100));
  }
  return [];
})"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make docs` builds (mkdocs.yml, strict: a broken link or a docstring warning fails it)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([Path(sys.executable).parent / "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on loopback (search needs a server; pages also open from disk)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")


def test_site_has_every_page_of_the_nav_and_the_measured_pages(site: Path) -> None:
    for page in ("index", "quickstart", "how-it-works", "architecture", "benchmarks", "benchmarks-core",
                 "reliability", "reference/configuration", "reference/plugins", "reference/metrics",
                 "reference/cli", "reference/api", "guides/air-gapped", "guides/operating"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "reference" / "api.html").read_text()
    assert "Reloader" in api and "load_config" in api  # mkdocstrings rendered the public API


async def test_every_page_renders_every_link_resolves_and_search_finds_a_key(
        site: Path, served: str, tmp_path: Path) -> None:
    pages = _pages(site)
    assert len(pages) >= 20
    seen: dict[str, dict[str, list[str]]] = {}
    async with browser_page(tmp_path / "profile") as page:
        for rel in pages:
            await page.goto(served + rel)
            got = await page.js(_PAGE)
            assert got["h1"] and got["text"] > 200, f"{rel} did not render: {got['h1']!r}, {got['text']} chars"
            assert not got["external"], f"{rel} fetches from outside: {got['external']}"
            seen[rel] = got
        assert not page.exceptions, page.exceptions

        broken = []
        for rel, got in seen.items():
            for href in got["links"]:
                if not href.startswith(served):
                    continue
                url, fragment = urldefrag(href)
                target = urlsplit(url).path.removeprefix(urlsplit(served).path) or "index.html"
                if target.endswith("/"):
                    target += "index.html"
                if not (site / target).is_file():
                    broken.append(f"{rel} -> {href} (no such file)")
                elif fragment and target in seen and fragment not in seen[target]["ids"]:
                    broken.append(f"{rel} -> {href} (no such anchor)")
        assert not broken, "\n".join(broken)

        await page.goto(served + "index.html")
        hits = await asyncio.wait_for(page.js(f"{_SEARCH}('max_hold')"), 60)
        assert any("reference/configuration.html" in h for h in hits), hits
