"""MkDocs hook: publish the figures that live beside the results they draw.

The figures stay where the scripts write them (``results/``, ``benchmarks/results/``) and are
added to the site under the same paths, so a page links ``results/mnist_binary.png`` and the
strict build checks the link. Nothing is copied into ``docs/``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("results/*.png", "benchmarks/results/*.png", "benchmarks/results/*/*.png")


def on_files(files: Files, config) -> Files:
    for pattern in FIGURES:
        for path in sorted(REPO.glob(pattern)):
            uri = path.relative_to(REPO).as_posix()
            if files.get_file_from_path(uri) is None:
                files.append(File(uri, str(REPO), config["site_dir"], config["use_directory_urls"]))
    return files
