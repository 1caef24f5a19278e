"""Model artifacts: safe extraction of model.tar.gz and TF Serving model discovery.

A model archive comes from anywhere (a training job, a colleague, the internet), so
extraction refuses members that would land outside the model directory: absolute
names, ``..`` components, links (symbolic or hard) whose target leaves the directory,
chains of links that leave it only together (``d -> .`` then ``d/e -> ..``), and device
files. Nothing is written when an archive is refused.

Discovery follows the SageMaker TF Serving container (``tfs_utils.find_models``):
every ``saved_model.pb`` whose parent directory is all digits is a version of the
model named after the directory above it; a model directory that directly holds
``<version>/saved_model.pb`` is the model called ``model`` (``/opt/ml/model``).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field

from shipyard.serving.errors import ModelLoadError

DEFAULT_MODEL_NAME = "model"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def check_members(tar: tarfile.TarFile, root: str) -> list[tarfile.TarInfo]:
    """The archive's members, or ModelLoadError naming the first one that leaves ``root``."""
    root = os.path.realpath(root)
    members = tar.getmembers()
    for m in members:
        target = os.path.realpath(os.path.join(root, m.name))
        if (
            os.path.isabs(m.name)
            or ".." in m.name.replace("\\", "/").split("/")
            or not _inside(target, root)
        ):
            raise ModelLoadError(
                f"model archive member {m.name!r} would be written outside the "
                "model directory; refusing the archive"
            )
        if m.issym() or m.islnk():
            base = os.path.dirname(target) if m.issym() else root
            link = os.path.realpath(os.path.join(base, m.linkname))
            if os.path.isabs(m.linkname) or not _inside(link, root):
                raise ModelLoadError(
                    f"model archive member {m.name!r} links to {m.linkname!r}, "
                    "outside the model directory; refusing the archive"
                )
        elif not (m.isfile() or m.isdir()):
            raise ModelLoadError(
                f"model archive member {m.name!r} is a device or fifo; refusing the archive"
            )
    return members


def extract(archive: str, dest: str) -> None:
    """Extract ``archive`` (a .tar.gz) into the new directory ``dest``, all or nothing."""
    if not tarfile.is_tarfile(archive):
        raise ModelLoadError(
            f"model_data {archive!r} is not a tar archive; give a model.tar.gz "
            "(or a directory holding the model)"
        )
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".extract-")
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = check_members(tar, tmp)
            # "data" re-checks each member against the tree *as extracted so far*: a link
            # chain (d -> ., then d/e -> ..) looks harmless member by member on an empty
            # directory and escapes only once its first link exists
            tar.extractall(tmp, members=members, filter="data")
        check_tree(tmp)
        os.replace(tmp, dest)
    except tarfile.FilterError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        member = getattr(getattr(exc, "tarinfo", None), "name", "?")
        raise ModelLoadError(
            f"model archive member {member!r} would be written or link outside the model "
            f"directory through the links before it ({exc}); refusing the archive"
        ) from None
    except tarfile.TarError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"model_data {archive!r} could not be read: {exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_tree(model_dir: str) -> None:
    """Refuse a model directory holding links that leave it (a directory given as is)."""
    root = os.path.realpath(model_dir)
    for dirpath, dirnames, filenames in os.walk(model_dir):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                raise ModelLoadError(
                    f"{os.path.relpath(path, model_dir)!r} links outside the "
                    "model directory; refusing to serve it"
                )


@dataclass
class TFModel:
    """One TF Serving model: its name and version -> SavedModel directory."""

    name: str
    versions: dict[int, str] = field(default_factory=dict)

    @property
    def latest(self) -> int:
        return max(self.versions)


def find_tf_models(model_dir: str) -> dict[str, TFModel]:
    """Every ``<name>/<digits>/saved_model.pb`` under ``model_dir`` (TF Serving's layout)."""
    models: dict[str, TFModel] = {}
    for dirpath, dirnames, filenames in os.walk(model_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in ("code", "__pycache__"))
        if "saved_model.pb" not in filenames:
            continue
        version_dir = os.path.basename(dirpath)
        if not version_dir.isdigit():
            continue
        parent = os.path.dirname(dirpath)
        name = (
            DEFAULT_MODEL_NAME
            if os.path.realpath(parent) == os.path.realpath(model_dir)
            else os.path.basename(parent)
        )
        models.setdefault(name, TFModel(name)).versions[int(version_dir)] = dirpath
    return models
