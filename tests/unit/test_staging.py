"""Adapters pushed to a server's node (``rollout/staging.py``): only what vLLM
reads travels, a version appears whole or not at all, the same files are not
written twice, and a retired version is deleted."""

from __future__ import annotations

import pytest

from areal_marlaas.rollout import staging


@pytest.fixture
def trained(tmp_path):
    """A committed version as the trainer leaves it: the adapter and the task's
    optimizer state in one folder."""
    folder = tmp_path / "trainer" / "v3"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "optimizer.pt").write_bytes(b"moments" * 1000)
    return folder


def test_only_the_files_a_server_loads_travel(trained):
    files = staging.served_files(trained)
    assert sorted(files) == ["adapter_config.json", "adapter_model.safetensors"]
    assert files["adapter_model.safetensors"] == bytes(range(256)) * 64


def test_a_folder_without_an_adapter_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        staging.served_files(tmp_path)


def test_staged_files_are_read_back_byte_identical(trained, tmp_path):
    files = staging.served_files(trained)
    there = tmp_path / "node2" / "run" / "v3"
    assert staging.stage(there, files) is True
    assert staging.read_digest(there) == staging.digest(files)
    assert sorted(p.name for p in there.iterdir()) == sorted(files)
    # Nothing half-written is left beside it.
    assert [p.name for p in there.parent.iterdir()] == ["v3"]


def test_the_same_files_already_there_are_not_written_again(trained):
    # A shared mount: the trainer's own folder is the target.
    before = (trained / "adapter_model.safetensors").stat().st_mtime_ns
    assert staging.stage(trained, staging.served_files(trained)) is False
    assert (trained / "adapter_model.safetensors").stat().st_mtime_ns == before
    assert (trained / "optimizer.pt").exists()


def test_other_bytes_under_the_same_name_are_replaced_whole(trained, tmp_path):
    there = tmp_path / "node2" / "v3"
    stale = dict(staging.served_files(trained), **{"adapter_model.safetensors": b"x"})
    staging.stage(there, stale)
    files = staging.served_files(trained)
    assert staging.stage(there, files) is True
    assert staging.read_digest(there) == staging.digest(files)
    assert [p.name for p in there.parent.iterdir()] == ["v3"]


def test_digest_changes_with_any_byte_or_name(trained):
    files = staging.served_files(trained)
    flipped = dict(files)
    data = bytearray(files["adapter_model.safetensors"])
    data[100] ^= 1
    flipped["adapter_model.safetensors"] = bytes(data)
    renamed = {
        "adapter_x.json" if k == "adapter_config.json" else k: v
        for k, v in files.items()
    }
    assert (
        len({staging.digest(files), staging.digest(flipped), staging.digest(renamed)})
        == 3
    )


def test_a_file_name_that_leaves_the_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bad adapter file name"):
        staging.stage(tmp_path / "v1", {"../adapter_config.json": b"{}"})
    assert not (tmp_path / "adapter_config.json").exists()
    assert list(tmp_path.iterdir()) == []


def test_unstage_deletes_the_version(trained, tmp_path):
    there = tmp_path / "node2" / "v3"
    staging.stage(there, staging.served_files(trained))
    staging.unstage(there)
    assert not there.exists()
