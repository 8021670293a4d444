"""Packaging as users expect: an sdist and a wheel build, ``twine check`` passes, the wheel holds
``py.typed``, and the version is written in one place (``hypertorch_sid.__version__``)."""

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hypertorch_sid

REPO = Path(__file__).resolve().parents[1]

needs_build = pytest.mark.skipif(
    importlib.util.find_spec("build") is None or importlib.util.find_spec("twine") is None,
    reason="build and twine are not installed (pip install -e '.[dev]')",
)


def test_version_is_written_once():
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]\d+|rc\d+|\.dev\d+)?", hypertorch_sid.__version__)
    assert "version = attr: hypertorch_sid.__version__" in (REPO / "setup.cfg").read_text()
    assert "version" not in (REPO / "pyproject.toml").read_text().split("[build-system]")[0]


def test_package_is_typed():
    assert (REPO / "hypertorch_sid" / "py.typed").is_file()


@needs_build
def test_sdist_and_wheel_build_and_pass_twine_check(tmp_path):
    # --no-isolation: the build uses this environment's setuptools (no download).
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    version = hypertorch_sid.__version__
    wheel = tmp_path / f"hypertorch_sid-{version}-py3-none-any.whl"
    sdist = tmp_path / f"hypertorch_sid-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in tmp_path.iterdir())
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    names = zipfile.ZipFile(wheel).namelist()
    assert "hypertorch_sid/py.typed" in names
    assert "hypertorch_sid/core/optimizer.py" in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)
    metadata = zipfile.ZipFile(wheel).read(f"hypertorch_sid-{version}.dist-info/METADATA").decode()
    assert f"Version: {version}" in metadata
    for extra in ("bench", "plots", "docs", "dev", "examples"):
        assert f"Provides-Extra: {extra}" in metadata
