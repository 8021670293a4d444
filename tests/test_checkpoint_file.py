"""The Lightning-free checkpoint-file check: every zip record against its CRC-32."""

import io
import zipfile

import pytest
import torch

from hypertorch_sid.checkpoint_file import checkpoint_problem, verify_checkpoint_file
from hypertorch_sid.core.errors import ConfigurationError


def _saved(tmp_path, name="state.pt"):
    path = tmp_path / name
    torch.save({"w": torch.arange(64, dtype=torch.float32), "step": 3}, path)
    return path


def _flip_a_tensor_byte(path):
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    # the record's data follows its local header (30 bytes + name + extra field)
    name_len = int.from_bytes(raw[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(raw[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + 5] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_sound_file_and_non_files_have_no_problem(tmp_path):
    path = _saved(tmp_path)
    assert checkpoint_problem(path) is None
    assert checkpoint_problem(str(path)) is None
    verify_checkpoint_file(path)
    for other in (None, tmp_path / "missing.ckpt", "s3://bucket/x.ckpt", 3, tmp_path):
        assert checkpoint_problem(other) is None


def test_a_flipped_tensor_byte_loads_silently_but_is_found(tmp_path):
    path = _saved(tmp_path)
    _flip_a_tensor_byte(path)
    assert not torch.equal(torch.load(path)["w"], torch.arange(64, dtype=torch.float32))
    problem = checkpoint_problem(path)
    assert problem is not None and "truncated or corrupted" in problem and "CRC-32" in problem
    with pytest.raises(ConfigurationError, match="truncated or corrupted"):
        verify_checkpoint_file(path)


def test_empty_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    assert "is empty (0 bytes)" in checkpoint_problem(empty)
    path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "truncated or corrupted" in checkpoint_problem(path)


def test_legacy_format_and_records_without_crc_are_skipped(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    assert checkpoint_problem(legacy) is None
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        path = _saved(tmp_path, "no_crc.pt")
    finally:
        torch.serialization.set_crc32_options(before)
    _flip_a_tensor_byte(path)
    assert checkpoint_problem(path) is None
