"""An instance's disk of ``VolumeSizeInGB``: a sparse ext4 image mounted over its tree.

On SageMaker an instance's ``/opt/ml`` is an EBS volume of ``VolumeSizeInGB``: a job that
fills it gets ENOSPC at that size, and the host's disk, the other instances and the other
jobs are not touched. Here the instance's tree (``<job>/instances/algo-k``) gets the same:

* a sparse file ``<job>/disks/algo-k.img`` of ``size_gb`` GiB (only what the job writes
  takes host space: a 30 GB disk costs 4.4 MB up front), in the job's directory, which no
  instance can reach (only ``instances/`` is bound into them);
* ``mkfs.ext4`` without a journal, with lazy inode tables and no reserved blocks (the
  image is thrown away with the job: no journal to replay; every block is the job's);
  its root owned by the identity the job's processes run as, so they write ``/opt/ml``
  as they did before;
* a loop device attached with ``LOOP_CONFIGURE`` and autoclear (the kernel frees it with
  the last unmount: no loop device outlives the mount, whoever dies), mounted
  ``nosuid,nodev`` over the tree **in the host's mount namespace**, before any instance
  starts: each instance's ``/opt/ml`` bind and the job-wide ``instances/`` bind see it, and
  the host-side readers (uploads, the supervisor's failure and artifact reading) keep
  reading the tree where they always did while it is mounted.

``release`` at the job's end (after the last upload): what the host keeps of a tree
(``model/``, ``output/``, ``agent/``: what the Ray backend brings back from its nodes
too; and ``input/config/``, the contract files, for a user looking at how the instance
was configured) is copied beside it, the disk unmounted, the copy moved into the now-empty tree and
the image deleted. The copy never follows a link the job left (links stay links) and
keeps no set-uid bit. Measured in docs/decisions.md (issue 37).

Nothing here follows a path the job can write: the tree is opened ``O_PATH`` with
``shipyard.runtime.safepath`` below the job's directory and mounted through that fd; the
image is created ``O_EXCL | O_NOFOLLOW`` in a directory the job never sees.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shipyard.runtime import safepath
from shipyard.sandbox import kernel, shellreaper, tools

GIB = 1 << 30
EXT4_MAX_FILE = 16 << 40  # a file on ext4 with 4 KiB blocks stays below 16 TiB
DISKS_DIR = "disks"  # in the job's directory, beside instances/
# what the host keeps of a tree (Ray's too), and the contract files shipyard wrote for the
# instance (input/config: what a user reads to see how the instance was configured)
KEPT_PARTS = ("model", "output", "agent", "input/config")

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MNT_DETACH = 2
EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # shut down, flush nothing
EXT4_ROOT_INO = 2
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Disk:
    """One instance's mounted disk."""

    host: str
    tree: str  # the mount point: <job>/instances/algo-k
    image: str  # <job>/disks/algo-k.img
    size_gb: int  # as asked (VolumeSizeInGB)
    size: int  # bytes it has: less where the host's filesystem had less free (capped)

    @property
    def capped(self) -> bool:
        return self.size < self.size_gb * GIB


def missing_reason() -> str | None:
    """Why this machine cannot give instances a disk (None: it can)."""
    if os.geteuid() != 0:
        return "shipyard runs as a user without root, who cannot attach and mount a disk image"
    if not os.path.exists("/dev/loop-control"):
        return "this machine has no loop devices (/dev/loop-control is missing)"
    if tools.find("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed (apt-get install e2fsprogs)"
    return None


def image_path(job_dir: str, host: str) -> str:
    return os.path.join(job_dir, DISKS_DIR, f"{host}.img")


MIN_DISK = 16 << 20  # below this the host's filesystem is too full for a disk
FREE_SHARE = 0.9  # of the host's free space, split among the job's instances


def disk_size(free: int, size_gb: int, instances: int) -> int:
    """Bytes of an instance's disk: ``size_gb`` GiB, or less where the host's filesystem
    has less free than the job's instances together ask for. A sparse image larger than
    the free space would take the host's last blocks, and then a job's writes fail as
    I/O errors of its disk, long after write() returned, rather than as ENOSPC at once.
    Raises OSError when what is left is too small to be a disk."""
    share = int(free * FREE_SHARE) // max(1, instances) // (1 << 20) << 20
    size = min(size_gb * GIB, share)
    if size < MIN_DISK:
        raise OSError(
            errno.ENOSPC,
            f"the host's filesystem has {free / (1 << 20):.0f} MiB free, too little for "
            f"{instances} disk(s)",
        )
    return size


def create(job_dir: str, host: str, size_gb: int, instances: int = 1) -> Disk:
    """Make and mount the disk of ``host`` over its tree (created empty if absent), one of
    ``instances`` sharing the host's free space. Raises OSError with what failed; nothing
    is left behind when it does."""
    from shipyard.spec import check_volume_size  # the spec: not in every agent's start

    check_volume_size(size_gb)
    tree = os.path.join(job_dir, "instances", host)
    os.makedirs(tree, exist_ok=True)
    os.makedirs(os.path.join(job_dir, DISKS_DIR), mode=0o700, exist_ok=True)
    image = image_path(job_dir, host)
    owner = os.stat(tree, follow_symlinks=False)
    fs = os.statvfs(os.path.dirname(image))
    size = disk_size(fs.f_bavail * fs.f_frsize, size_gb, instances)
    try:
        size = _make_image(image, size, owner.st_uid, owner.st_gid)
        _mount_image(job_dir, tree, image)
    except BaseException:
        _unlink(image)
        raise
    return Disk(host=host, tree=tree, image=image, size_gb=size_gb, size=size)


def create_all(job_dir: str, hosts: list[str], size_gb: int) -> dict[str, Disk | str]:
    """Every host's disk at once (mkfs runs in parallel): each a Disk, or why not."""
    why = missing_reason()
    if why is not None:
        return {h: why for h in hosts}

    made: dict[str, Disk | str] = {}  # filled by the threads as each disk is mounted

    def one(host: str) -> None:
        try:
            made[host] = create(job_dir, host, size_gb, len(hosts))
        except OSError as exc:
            made[host] = f"its disk could not be made: {exc}"

    try:
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            list(pool.map(one, hosts))
    except BaseException:
        # Ctrl-C (or SIGTERM as one) reaches this thread only; leaving the pool waited for
        # the threads, so every disk they mounted is in `made`, and none may stay mounted
        # with no one left to release it
        release_all([d for d in made.values() if isinstance(d, Disk)], job_dir)
        raise
    return {h: made[h] for h in hosts}


# The file system's layout, for an image that lives one job: no journal (nothing to
# replay), no room to grow (never resized); two backup superblocks, not one per sparse
# group (sparse_super2), and the block groups' bitmaps and inode tables packed in flex
# groups of 1024 (-G): the metadata mkfs writes is then a few runs of blocks, not dozens
# spread over the image, so the sparse image holds 5 extents instead of 28 and its
# unlink at the job's end frees them in 0.5 ms instead of 1.9 (mkfs 3.6 -> 2.7 ms;
# 30 GB, median of 9, issue 40)
FEATURES = "^has_journal,^resize_inode,sparse_super2"
FLEX_GROUPS = "1024"


def _make_image(image: str, size: int, uid: int, gid: int) -> int:
    """A sparse image of ``size`` bytes with an empty ext4 on it; returns its size."""
    fd = os.open(image, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            try:
                os.ftruncate(fd, size)  # sparse: no block is allocated
            except OSError as exc:
                if exc.errno != errno.EFBIG or size < EXT4_MAX_FILE:
                    raise
                # 16384 GB is one byte past what ext4 holds in a file (16 TiB - 4 KiB)
                size = EXT4_MAX_FILE - (1 << 20)
                os.ftruncate(fd, size)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"the host's filesystem cannot hold a sparse file of {size / GIB:.1f} GB "
                f"({os.strerror(exc.errno or 0)})",
            ) from None
    finally:
        os.close(fd)
    mkfs = tools.find("mkfs.ext4") or "mkfs.ext4"
    options = f"lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={uid}:{gid}"
    done = subprocess.run(
        [mkfs, "-q", "-F", "-m", "0", "-O", FEATURES, "-G", FLEX_GROUPS, "-E", options, image],
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise OSError(f"mkfs.ext4 failed: {done.stderr.decode(errors='replace').strip()}")
    return size


def _loop_config(image_fd: int) -> bytes:
    """struct loop_config: fd, block_size, loop_info64 (lo_flags at byte 52), reserved."""
    raw = bytearray(304)
    raw[0:4] = image_fd.to_bytes(4, "little")
    info = 8  # loop_info64 after fd and block_size
    flags_at = info + 5 * 8 + 3 * 4  # after 5 u64 and lo_number, encrypt type, key size
    raw[flags_at : flags_at + 4] = LO_FLAGS_AUTOCLEAR.to_bytes(4, "little")
    return bytes(raw)


def _attach_loop(image: str) -> tuple[int, str]:
    """A free loop device bound to ``image`` with autoclear: (its fd, its path)."""
    image_fd = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):  # another process may take the same free device first
                number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                path = f"/dev/loop{number}"
                loop_fd = _open_loop(path)
                try:
                    fcntl.ioctl(loop_fd, LOOP_CONFIGURE, _loop_config(image_fd))
                    return loop_fd, path
                except OSError as exc:
                    os.close(loop_fd)
                    if exc.errno != errno.EBUSY:
                        raise OSError(exc.errno, f"attaching {path}: {exc.strerror}") from None
            raise OSError(errno.EBUSY, "no free loop device after 64 tries")
        finally:
            os.close(ctl)
    finally:
        os.close(image_fd)


def _open_loop(path: str) -> int:
    """The loop device's node; udev may create it a moment after LOOP_CTL_GET_FREE."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _mount_image(job_dir: str, tree: str, image: str) -> None:
    """Mount the image over the tree through an fd opened without following links."""
    loop_fd, device = _attach_loop(image)
    try:
        target = safepath.open_beneath(job_dir, tree, os.O_PATH | os.O_DIRECTORY)
        try:
            kernel.mount(
                device, f"/proc/self/fd/{target}", "ext4", kernel.MS_NOSUID | kernel.MS_NODEV
            )
        finally:
            os.close(target)
    finally:
        os.close(loop_fd)  # the mount holds the device; autoclear frees it at the unmount
    try:
        os.rmdir(os.path.join(tree, "lost+found"))  # not part of SageMaker's /opt/ml
    except OSError:
        pass


def is_mounted(tree: str) -> bool:
    """Whether ``tree`` is a mount point in this mount namespace (mountinfo's word)."""
    return tree in mount_points()


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        return [_unescape(line.split()[4]) for line in fh if len(line.split()) > 4]


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (space, tab, newline, backslash)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def detach_others(own_instances: str) -> int:
    """In an instance's new mount namespace (a copy of the host's): detach every other
    job's disk. A copy holds its file system, so the other job's unmount at its end would
    not free its loop device, nor the host space of its deleted image, until this
    instance ended. Only shipyard disks are touched: a loop-backed mount at
    ``<job>/instances/<host>`` whose backing file is ``<job>/disks/<host>.img``. Returns
    how many were detached."""
    own = os.path.abspath(own_instances).rstrip("/") + "/"
    backing = _loop_backing()
    detached = 0
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        fields = line.split()
        try:
            source = fields[fields.index("-", 6) + 2]
        except (ValueError, IndexError):
            continue
        point = _unescape(fields[4])
        image = backing.get(os.path.basename(source))
        if image is None or point.startswith(own):
            continue
        job_dir = os.path.dirname(os.path.dirname(point))
        if image.removesuffix(" (deleted)") != image_path(job_dir, os.path.basename(point)):
            continue
        if _libc.umount2(os.fsencode(point), MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
            detached += 1
    return detached


def _loop_backing() -> dict[str, str]:
    """Each attached loop device's name (``loop3``) and its backing file."""
    out = {}
    base = "/sys/block"
    for name in os.listdir(base) if os.path.isdir(base) else []:
        if not name.startswith("loop"):
            continue
        try:
            with open(os.path.join(base, name, "loop", "backing_file"), encoding="utf-8") as fh:
                out[name] = fh.read().strip()
        except OSError:
            continue
    return out


def loop_backing_files() -> list[str]:
    """Every attached loop device's backing file (sysfs)."""
    return list(_loop_backing().values())


def release(disk: Disk, job_dir: str) -> str | None:
    """Keep the tree's ``KEPT_PARTS``, unmount the disk, delete its image. None when
    done; else what went wrong (the image is then kept, named, unmounted)."""
    kept = os.path.join(job_dir, DISKS_DIR, f"{disk.host}.kept")
    note = None
    if os.path.lexists(kept):
        shutil.rmtree(kept, ignore_errors=True)
    os.makedirs(kept, mode=0o700)
    try:
        _copy_parts(disk.tree, kept, KEPT_PARTS)
    except OSError as exc:
        note = (
            f"{disk.host}'s tree could not be copied off its disk ({exc}); the disk's "
            f"image is kept at {disk.image}: mount it with `mount -o loop,ro {disk.image} DIR`"
        )
    if note is None:  # the parts are safe: what the disk still has to write is not
        _discard_writes(disk)
    _unmount(disk.tree)
    if note is None:
        for part in os.listdir(kept):
            target = os.path.join(disk.tree, part)
            if os.path.lexists(target):  # what was under the mount point before it
                _remove(target)
            os.rename(os.path.join(kept, part), target)
        _unlink(disk.image)
    shutil.rmtree(kept, ignore_errors=True)
    return note


def release_all(disks: list[Disk], job_dir: str) -> dict[str, str | None]:
    """``release`` for every disk at once (the copies and unmounts overlap): per host,
    None or what went wrong."""

    def one(d: Disk) -> str | None:
        try:
            return release(d, job_dir)
        except OSError as exc:
            return f"{d.host}'s disk could not be released: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, len(disks))) as pool:
        return dict(zip([d.host for d in disks], pool.map(one, disks)))


REAPER_SCRIPT = """
read line && [ "$line" = released ] && exit 0
while [ $# -ge 2 ]; do
  tree=$1; image=$2; shift 2
  kept="$image.kept"
  rm -rf "$kept" && mkdir -m 700 "$kept" || continue
  for part in model output agent; do
    [ -e "$tree/$part" ] && cp -R -P --preserve=timestamps "$tree/$part" "$kept/" 2>/dev/null
  done
  if [ -d "$tree/input/config" ] && [ ! -L "$tree/input" ] && [ ! -L "$tree/input/config" ]; then
    mkdir -m 700 "$kept/input" && cp -R -P --preserve=timestamps "$tree/input/config" "$kept/input/"
  fi
  umount -l "$tree" 2>/dev/null
  for part in model output agent input; do
    [ -e "$kept/$part" ] && rm -rf "$tree/$part" && mv "$kept/$part" "$tree/"
  done
  rm -rf "$kept"
  rm -f "$image"
done
"""


def start_reaper(disks: list[Disk]) -> subprocess.Popen | None:
    """A shell holding a pipe from this process (the supervisor): told ``released`` when
    ``release_all`` is done, it exits; when the pipe closes without it (the supervisor
    was killed), it does what ``release`` would (keep ``model/``, ``output/``, ``agent/``,
    ``input/config/`` without following a link, unmount lazily, delete the image), so no disk outlives its
    job (the cgroups' reaper works the same way, shipyard.sandbox.cgroups)."""
    if not disks:
        return None
    args = [part for d in disks for part in (d.tree, d.image)]
    return shellreaper.start(REAPER_SCRIPT, "shipyard-disk-reaper", args)


def stop_reaper(reaper: subprocess.Popen | None) -> None:
    """The disks are released: the reaper exits without touching them."""
    if reaper is None or reaper.stdin is None:
        return
    try:
        reaper.stdin.write(b"released\n")
        reaper.stdin.close()
        reaper.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _discard_writes(disk: Disk) -> None:
    """Shut the disk's file system down (``EXT4_IOC_SHUTDOWN``, no flush) once its kept
    parts are copied off: the unmount then does not write the job's data, still dirty in
    the page cache, through the loop device into an image deleted right after (measured:
    64 MiB in ``model/``, unmount 52 -> 7 ms, the image's unlink 15 -> 1 ms). Done only to
    the file system whose root is this disk's (its loop device's backing file is
    ``disk.image``): never to another. Any failure leaves the plain unmount's sync."""
    try:
        fd = os.open(disk.tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if _is_root_of(fd, disk.image):
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH.to_bytes(4, "little"))
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_root_of(fd: int, image: str) -> bool:
    """Whether ``fd`` is the root directory of the file system on the loop device whose
    backing file is ``image``."""
    st = os.fstat(fd)
    if st.st_ino != EXT4_ROOT_INO or not stat.S_ISDIR(st.st_mode):
        return False
    sysfs = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/loop/backing_file"
    try:
        with open(sysfs, encoding="utf-8", errors="replace") as fh:
            backing = fh.read().rstrip("\n")
    except OSError:
        return False
    return backing == os.path.realpath(image)


def _unmount(tree: str) -> None:
    """Unmount; a busy disk (something on the host still in it) is detached lazily: the
    kernel frees it, and its loop device, with the last reference."""
    target = os.fsencode(tree)
    if _libc.umount2(target, UMOUNT_NOFOLLOW) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EBUSY and _libc.umount2(target, UMOUNT_NOFOLLOW | MNT_DETACH) == 0:
        return
    err = ctypes.get_errno() or err
    raise OSError(err, f"unmounting the disk at {tree}: {os.strerror(err)}")


def _copy_parts(tree: str, dest: str, parts: Iterable[str]) -> None:
    """Each part (``a`` or ``a/b``) copied to the same place under ``dest``; a part that is
    missing, or has a link or a non-directory on its way, is left out."""
    tree_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            *parents, name = part.split("/")
            fds: list[int] = []
            try:
                fd = tree_fd
                try:
                    for parent in parents:
                        fd = os.open(
                            parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd
                        )
                        fds.append(fd)
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        continue
                    raise
                if parents:
                    os.makedirs(os.path.join(dest, *parents), mode=0o700, exist_ok=True)
                _copy_entry(fd, name, st, os.path.join(dest, part))
            finally:
                for opened in fds:
                    os.close(opened)
    finally:
        os.close(tree_fd)


def _copy_entry(dir_fd: int, name: str, st: os.stat_result, dest: str) -> None:
    """One entry, relative to ``dir_fd``: links copied as links, directories walked by fd,
    regular files by content; anything else (a fifo, a socket) left out. Modes keep their
    permission bits only (no set-uid, set-gid)."""
    mode = stat.S_IMODE(st.st_mode) & 0o1777
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=dir_fd), dest)
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            os.mkdir(dest, 0o700)
            for entry in os.scandir(fd):
                _copy_entry(
                    fd,
                    entry.name,
                    entry.stat(follow_symlinks=False),
                    os.path.join(dest, entry.name),
                )
        finally:
            os.close(fd)
        os.chmod(dest, mode)
    elif stat.S_ISREG(st.st_mode):
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                _copy_fd(src, out, st.st_size)
                os.fchmod(out, mode)
            finally:
                os.close(out)
        finally:
            os.close(src)
    else:
        return
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy_fd(src: int, out: int, size: int) -> None:
    """The file's content, in the kernel (sendfile) where it can; by reads otherwise."""
    left = size
    try:
        while left > 0:
            sent = os.sendfile(out, src, None, min(left, 1 << 30))
            if sent == 0:
                break
            left -= sent
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EXDEV):
            raise
    while chunk := os.read(src, 1 << 20):  # what sendfile did not send
        os.write(out, chunk)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
