"""The Python examples of the README and of the documentation pages run as written.

Every block fenced ```` ```python ```` in ``README.md`` and ``docs/**/*.md`` runs, each in a fresh
namespace and a temporary working directory; a block fenced ```` ```py ```` is a fragment, shown
but not run."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCKS = [
    (page.relative_to(REPO).as_posix(), i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]


def test_readme_has_examples():
    assert sum(page == "README.md" for page, _, _ in BLOCKS) >= 2


@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{page}-{i}" for page, i, _ in BLOCKS])
def test_example_runs(page, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} block {index}", "exec"), {"__name__": "readme"})


def test_readme_links_point_to_files_in_the_repository():
    text = (REPO / "README.md").read_text()
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)}
    local = sorted(t for t in targets if t and "://" not in t)
    assert local, "the README links its documentation pages"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
