"""Every link of the README and of the docs pages resolves.

A relative link must name a file of the repository, and its ``#anchor`` a heading of that page as
MkDocs slugs it (Python-Markdown's ``toc`` extension, as ``mkdocs.yml`` configures it: the
heading's text, lower case, punctuation dropped, spaces as hyphens, a repeat suffixed ``_1``).
The anchors are read from the rendered page, so the test fails on a renamed heading.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the README and every page of the docs
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1", flags=re.S | re.M)


def links(page: str) -> list[str]:
    """The relative link targets of ``page``, code blocks left out."""
    text = FENCE.sub("", (REPO / page).read_text())
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


@cache
def anchors(path: Path) -> frozenset[str]:
    """The heading ids MkDocs gives ``path`` (Markdown pages only)."""
    markdown = pytest.importorskip("markdown")
    md = markdown.Markdown(extensions=["toc", "fenced_code", "attr_list", "tables", "md_in_html"])
    md.convert(path.read_text())

    def ids(tokens: list[dict]) -> list[str]:
        return [i for t in tokens for i in (t["id"], *ids(t["children"]))]

    return frozenset(ids(md.toc_tokens))


def target(page: str, link: str) -> tuple[Path, str]:
    """The file ``link`` names from ``page``, and its anchor ('' for none).

    On the site a figure of ``results/`` or ``benchmarks/results/`` sits at the docs' root
    (``docs/hooks/repo_files.py``), so a page of ``docs/`` links it as if ``docs/`` were the
    repository's root."""
    file, _, anchor = link.partition("#")
    path = ((REPO / page).parent / file if file else REPO / page).resolve()
    docs = REPO / "docs"
    if not path.exists() and path.suffix == ".png" and path.is_relative_to(docs):
        path = REPO / path.relative_to(docs)
    return path, anchor


CASES = [(page, link) for page in PAGES for link in links(page)]


def test_the_readme_links_its_pages():
    assert sum(page == "README.md" for page, _ in CASES) >= 10


@pytest.mark.parametrize("page, link", CASES, ids=[f"{p}:{link}" for p, link in CASES])
def test_link_resolves(page, link):
    path, anchor = target(page, link)
    assert path.exists(), f"{page} links {link!r}: {path.relative_to(REPO)} does not exist"
    if anchor:
        assert path.suffix == ".md", f"{page} links {link!r}: an anchor into a non-Markdown file"
        assert anchor in anchors(path), (
            f"{page} links {link!r}: no heading of {path.relative_to(REPO)} has the id {anchor!r}"
            f" (MkDocs' ids there include e.g. {sorted(anchors(path))[:5]})"
        )


def test_the_slug_is_mkdocs():
    """The slugging the test relies on, on headings of the kinds the docs use."""
    page = REPO / "docs" / "data_weights.md"
    assert "session-53-imbalanced-data-without-a-sampler" in anchors(page)
    assert "flags-the-network-contradicts-flaggedsplit_misfit-session-48-an-option" in anchors(page)
