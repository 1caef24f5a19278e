"""Issue 20, defect 10 (model_data part): a link chain in model.tar.gz is refused at
extraction, and nothing lands outside the model directory.

``d -> .`` then ``d/e -> ..`` each look harmless on an empty directory; together ``d/e``
points above the model directory and ``d/e/escape.txt`` lands outside it. Before the fix
extraction accepted the archive (wrote the file outside), and only the load-time tree
check refused the model afterwards.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from shipyard.serving import model_data
from shipyard.serving.errors import ModelLoadError


def _archive(path: str, with_file: bool) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, target in (("d", "."), ("d/e", "..")):
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        if not with_file:
            return
        payload = b"written outside the model directory"
        info = tarfile.TarInfo("d/e/escape.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))


@pytest.mark.parametrize("with_file", [False, True], ids=["chain", "chain+file"])
def test_symlink_chain_is_refused_at_extraction(tmp_path, with_file):
    archive = tmp_path / "model.tar.gz"
    _archive(str(archive), with_file)
    area = tmp_path / "endpoint"
    area.mkdir()
    dest = area / "model"
    with pytest.raises(ModelLoadError) as err:
        model_data.extract(str(archive), str(dest))
    assert "refusing the archive" in str(err.value)
    assert not dest.exists()
    assert sorted(os.listdir(area)) == []  # no temp dir, no escaped file
    assert not (tmp_path / "escape.txt").exists()


def test_a_plain_archive_with_an_inner_link_still_extracts(tmp_path):
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"weights"
        info = tarfile.TarInfo("1/variables.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("latest")
        link.type = tarfile.SYMTYPE
        link.linkname = "1"
        tar.addfile(link)
    dest = tmp_path / "model"
    model_data.extract(str(archive), str(dest))
    assert (dest / "latest" / "variables.bin").read_bytes() == b"weights"
