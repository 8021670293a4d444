"""The documentation builds: ``mkdocs build --strict`` (a broken link, a page missing from the
nav's files, an API reference that does not resolve, a missing snippet: all fail), offline."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None
    or importlib.util.find_spec("mkdocstrings_handlers") is None
    or importlib.util.find_spec("material") is None,
    reason='MkDocs, mkdocs-material or mkdocstrings is not installed (pip install -e ".[docs]")',
)
def test_documentation_builds_strict(tmp_path):
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for page in ["index.html", "core/index.html", "api/core/index.html", "changelog/index.html"]:
        assert (site / page).is_file(), page
    core = (site / "core" / "index.html").read_text()
    assert 'class="arithmatex"' in core  # equations marked for the vendored KaTeX
    assert "assets/katex/katex.min.js" in core
    api = (site / "api" / "core" / "index.html").read_text()
    assert "SIDHyperOptimizer" in api and "hypergradient" in api
    for page in ("core", "lightning"):  # numpy sections parsed, Sphinx roles shown as code
        html = (site / "api" / page / "index.html").read_text()
        assert "doc-section-title" in html and "<table" in html, page
        assert not re.search(r":(class|func|meth|mod|data|attr|exc):<code>", html), page
    assert (site / "results" / "lightning_digits.png").is_file()
