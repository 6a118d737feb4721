"""The API docs work offline: /docs (Swagger UI) and /redoc load every asset from this server."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest


class _Assets(HTMLParser):
    """Every URL a page loads or links: src/href attributes and url(...) / "…js" strings in scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._script: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data: str) -> None:
        # Swagger UI's page names its spec and oauth2 redirect in the inline script.
        self.urls += re.findall(r"""['"]((?:https?:)?//[^'"]+|/[^'"\s]+)['"]""", data)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(client: httpx.Client, page: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text[:300]
    parser = _Assets()
    parser.feed(r.text)
    assert parser.urls, "no assets found: the page format changed"
    remote = [u for u in parser.urls if re.match(r"^(https?:)?//", u)]
    assert not remote, f"{page} loads from other hosts: {remote}"
    assert "validator.swagger.io" not in r.text  # Swagger UI's online spec validator badge
    for url in parser.urls:
        got = client.get(url)
        assert got.status_code == 200, (url, got.status_code)
        assert got.content, url
    scripts = [u for u in parser.urls if u.endswith(".js")]
    assert scripts, f"{page} has no script of its own"
