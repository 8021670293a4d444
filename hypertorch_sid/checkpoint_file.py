"""Integrity check of a checkpoint file: every zip record against its stored CRC-32.

``torch.load`` reads the records of a zip-format checkpoint without checking their CRC-32, so a
file with flipped or zeroed bytes inside a tensor loads silently. Nothing here depends on SID or
Lightning: :class:`~hypertorch_sid.lightning.HyperOptimizationCallback` runs it on resume.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from .core.errors import ConfigurationError

__all__ = ["checkpoint_problem", "verify_checkpoint_file"]


def checkpoint_problem(path: Any) -> str | None:
    """What is wrong with a local zip-format checkpoint file, or None if nothing is found.

    Every record is checked against its stored CRC-32: ``torch.load`` reads records without that
    check, so a checkpoint with flipped or zeroed bytes inside a tensor loads silently (e.g. a
    corrupted random-generator state). Records saved without a CRC
    (``torch.serialization.set_crc32_options(False)`` stores 0) are skipped, as are remote paths
    and files that are not zip archives (the legacy format).
    """
    if path is None or not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if size == 0:
        return f"the checkpoint {os.fspath(path)!r} is empty (0 bytes)."
    if magic != b"PK\x03\x04":
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0:
                    continue
                with archive.open(info) as record:  # raises BadZipFile on a CRC mismatch
                    while record.read(1 << 20):
                        pass
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return (
            f"the checkpoint {os.fspath(path)!r} ({size} bytes) is truncated or corrupted: "
            f"{err}. Resume from an earlier checkpoint."
        )
    return None


def verify_checkpoint_file(path: Any) -> None:
    """Raise :class:`ConfigurationError` if :func:`checkpoint_problem` finds something."""
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigurationError(problem)
