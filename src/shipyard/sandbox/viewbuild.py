"""The filesystem view of an instance's processes, built by its init (shipyard.sandbox.init).

Stdlib only and imported by the init from its directory (``python -S``, no site), so from
its cached bytecode: the init itself is the small script run by path, which Python
compiles at every start (this module's source took 5-6 ms of CPU per instance to
compile, one init per instance started at once). It imports neither ``json`` nor ``re``
nor ``glob`` nor ``enum``: the view comes as ``encode_view``'s line and the agent
expands its glob patterns (shipyard.sandbox.pidns.expand_patterns).

The view, in the order it is built (each step on its own: one the kernel refuses is
named, the others still hold):

* ``root_overlay``: a new root (``pivot_root``), a tmpfs whose top-level directories are
  overlays of the host's with a writable layer in memory, thrown away with the instance
  (scripts writing ``/etc/...``, ``/usr/local/...`` or a new ``/data`` run, the host is
  untouched); the host's other mounts bound at their places; where the kernel refuses
  the new root, only the ``overlay`` directories (``/etc``, ``/usr/local``, ...) get a layer;
* ``devices``: a ``/dev`` of its own (a tmpfs with the host's ``null``, ``zero``, GPUs,
  ...; a devpts of its own): no disk of the host's;
* ``mask`` and ``private_tmp``: directories (``$SHIPYARD_HOME``, ``/root``, ``/home``,
  ``/dev/shm``, ``/tmp``) replaced by an empty writable tmpfs (``~/.keras`` works and
  vanishes), into which only the ``keep_rw`` (the job's own directory, paths its spec
  names) and ``keep_ro`` paths (the Python environment, local channels) under them are
  bound back: other jobs' trees and secrets, the server's store, home directories and
  the host's ``/tmp`` are not there;
* ``read_only``: the Python environment, bound read-only over itself;
* then every mount taken from the host (``/sys``, other disks) is made read-only, except
  the instance's own (``writable``: ``/opt/ml``, ``/etc/hosts``, its ``/dev``), and so are
  ``/proc/sys`` and ``/proc/sysrq-trigger`` (uid 0 writes sysctls by file permission).
"""

from __future__ import annotations

import ctypes
import os
import stat

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 1 << 14, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)
OLD_ROOT = ".shipyard-old-root"
# mounts that stay writable in the instance: its own /proc (its sysctls excepted), its
# ptys (the tmpfs it was given are named in the view)
NEVER_READ_ONLY = ("proc", "devpts", "mqueue")
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")  # when the view names none
# filesystems no layer goes over (the kernel's, bound as they are and made read-only)
NOT_LAYERED = frozenset(
    "proc sysfs devtmpfs devpts mqueue cgroup cgroup2 securityfs debugfs tracefs bpf "
    "pstore configfs fusectl binfmt_misc autofs hugetlbfs efivarfs nsfs".split()
)
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)
DEVPTS_OPTIONS = "newinstance,ptmxmode=0666,mode=0620"

libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    pass


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data) if data else None):
        err = ctypes.get_errno()
        raise Refused(f"mount {source or fstype} on {target}: {os.strerror(err)}")


def _bind(fd: int, target: str, read_only: bool) -> None:
    is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if read_only:
        _read_only(target)


def _read_only(target: str) -> None:
    """Remount the mount at ``target`` read-only (this mount only, not those below it),
    keeping the flags it has: in a user namespace the kernel refuses a remount that would
    clear a flag the mount was given outside it (nosuid, nodev, noexec)."""
    kept = os.statvfs(target).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount of this namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            out.append((unescape(left.split()[4]), right.split()[0]))
    return out


OCTAL = frozenset("01234567")


def unescape(field: str) -> str:
    """A mountinfo field with the kernel's octal escapes (``\\040`` for a space, ``\\134``
    for a backslash) decoded."""
    if "\\" not in field:
        return field
    first, *rest = field.split("\\")
    out = [first]
    for part in rest:
        if len(part) >= 3 and OCTAL.issuperset(part[:3]):
            out.append(chr(int(part[:3], 8)) + part[3:])
        else:
            out.append("\\" + part)
    return "".join(out)


MAGIC = frozenset("*?[")


def expand(pattern: str) -> list[str]:
    """The existing paths a glob pattern names, sorted, as ``glob.glob`` finds them. A
    pattern whose wildcards are only ``*`` in its last part (``/dev/nvidia*``,
    ``/etc/ssh/ssh_host_*key``) is matched here: ``glob`` compiles each pattern to a
    regular expression (``re``'s compiler: 1-5 ms of every sandboxed agent's start);
    anything else goes to ``glob``."""
    if not MAGIC.intersection(pattern):
        return [pattern] if os.path.lexists(pattern) else []
    directory, _, name = pattern.rpartition("/")
    if "?" in name or "[" in name or MAGIC.intersection(directory) or not directory:
        import glob

        return sorted(glob.glob(pattern))
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    parts = name.split("*")
    return sorted(
        f"{directory}/{n}"
        for n in names
        if _stars_match(n, parts) and (name.startswith(".") or not n.startswith("."))
    )


def _stars_match(name: str, parts: list[str]) -> bool:
    """``name`` matches the pattern ``"*".join(parts)`` (``*``: any run of characters)."""
    first, *middle, last = parts
    if len(name) < len(first) + len(last) or not (name.startswith(first) and name.endswith(last)):
        return False
    at, end = len(first), len(name) - len(last)
    for part in middle:
        found = name.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


def encode_view(view: dict) -> str:
    """A view (or a list under the key ``missing``) as one line of ``key=hex,hex;...``:
    each item's UTF-8 bytes in hex (any path, no quoting), a True flag as one ``1``, a
    False one as none; read back by ``decode_view`` without ``json``."""
    fields = []
    for key, value in view.items():
        if isinstance(value, bool):
            items = ["1"] if value else []
        elif isinstance(value, str):
            items = [value]
        else:
            items = list(value)
        fields.append(key + "=" + ",".join(os.fsencode(i).hex() for i in items))
    return ";".join(fields)


def decode_view(text: str) -> dict[str, list[str]]:
    """``encode_view``'s inverse: each key's items (a flag's: ``["1"]`` or ``[]``)."""
    view: dict[str, list[str]] = {}
    for field in text.split(";"):
        key, _, items = field.partition("=")
        if key:
            view[key] = [os.fsdecode(bytes.fromhex(i)) for i in items.split(",") if i]
    return view


def _outermost(points: list[str]) -> list[str]:
    return [p for p in points if not any(q != p and _under(p, q) for q in points)]


def build(view: dict) -> list[str]:
    """The view (see the module docstring); returns what could not be done, with why."""
    missing: list[str] = []
    fresh = view.get("fresh", [])  # /run, /var/run: the instance's own, empty
    private = [*view.get("mask", []), *view.get("private_tmp", []), *fresh]
    writable = [*view.get("keep_rw", []), *private, *view.get("writable", [])]
    keep = sorted(
        [(p, False) for p in [*view.get("keep_rw", []), *view.get("keep_own", [])]]
        + [(p, True) for p in view.get("keep_ro", [])],
        key=lambda item: item[0].count("/"),  # a path before the paths inside it
    )
    fds: dict[str, int] = {}
    for path, _ in keep:
        try:
            fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    old_root: str | None = None
    layers: list[str] = []
    if view.get("root_overlay"):
        try:
            old_root, layers = _new_root(view.get("writable", []), private, missing)
        except (Refused, OSError) as exc:
            missing.append(
                f"/ is the host's ({exc}): only {', '.join(view.get('overlay', []))} get a "
                "throw-away writable layer"
            )
    if old_root is None:
        for directory in view.get("overlay", []):
            try:
                _overlay(directory)
            except (Refused, OSError) as exc:
                missing.append(f"{directory} is the host's, writable: {exc}")
    if old_root is not None:
        missing += _private_dev(view.get("devices", []))
    for top in private:
        if not os.path.isdir(top):
            continue
        try:
            mode = "1777" if top in view.get("sticky", []) else "0755"  # /tmp: everyone's
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
            if top in fresh:  # /run/lock, as a distribution's /run has it
                os.mkdir(f"{top}/lock")
                os.chmod(f"{top}/lock", 0o1777)
        except Refused as exc:
            missing.append(f"{top} is visible: {exc}")
            private = [p for p in private if p != top]
    for path, read_only in keep:
        # a kept path is bound where it is otherwise not there (under a mask, in the
        # private /tmp) and, read-write, where the throw-away root would swallow writes
        hidden = any(_under(path, top) for top in private)
        if path in fds and (hidden or (old_root is not None and not read_only)):
            try:
                _bind(fds[path], path, read_only)
            except (Refused, OSError) as exc:
                missing.append(f"{path} is not reachable: {exc}")
    for top in view.get("sealed", []):
        if any(_under(top, m) for m in private):  # never a directory of the host's
            missing += _seal(top, [p for p, _ in keep])
    for path in view.get("read_only", []):
        if not os.path.isdir(path):
            continue
        try:
            _mount(path, path, None, MS_BIND | MS_REC)
            _read_only(path)
        except Refused as exc:
            missing.append(f"{path} is writable: {exc}")
    for fd in fds.values():
        os.close(fd)
    if old_root is not None:
        missing += _detach(old_root)
        missing += _host_mounts_read_only(writable, layers)
    missing += _kernel_settings_read_only(view.get("proc_read_only", PROC_READ_ONLY))
    missing += _masks(view.get("proc_mask", []), view.get("secrets", []))
    return missing


def _seal(top: str, kept: list[str]) -> list[str]:
    """A masked directory that holds kept paths (the job's own trees inside its
    ``SHIPYARD_HOME``): passed through, never listed or changed. Every directory from
    ``top`` down to a kept path is mode 0111 and ``top`` is bound read-only over itself
    (its kept mounts carried along, still writable), so a job sees no name the host
    keeps there, not even its own job's records' (issue 37)."""
    inside = [p for p in kept if p != top and _under(p, top)]
    if not inside or not os.path.isdir(top):
        return []
    dirs = {top}
    for path in inside:
        parent = os.path.dirname(path)
        while parent != top and _under(parent, top):
            dirs.add(parent)
            parent = os.path.dirname(parent)
    try:
        for directory in dirs:
            os.chmod(directory, 0o111)
        _mount(top, top, None, MS_BIND | MS_REC)
        _read_only(top)
    except (Refused, OSError) as exc:
        return [f"{top} can be listed: {exc}"]
    return []


def _new_root(
    as_is: list[str] | None = None,
    covered: list[str] | None = None,
    notes: list[str] | None = None,
    scratch: str = "/tmp",
) -> tuple[str, list[str]]:
    """Make this mount namespace's root a tmpfs whose every top-level directory is an
    overlay: the host's directory below, a writable layer in memory above (thrown away
    with the instance). A host mount point inside (or as) such a directory gets a layer
    of its own the same way, so no host Unix socket is reachable anywhere in the view
    (an overlay's socket inode is not the socket's: ``connect()`` is refused), while a
    read-only bind would have left ``/run/docker.sock`` or D-Bus answering; a socket
    bound as a mount point of its own is left out. The instance's own mounts
    (``as_is``: ``/etc/hosts``, ``/opt/ml``), what a tmpfs will cover (``covered``:
    ``/run``, the homes) and the kernel's filesystems (``/proc``,
    ``/sys``, ``/dev``) are bound as they are, and made read-only later (the kernel's);
    a mount point the kernel will not layer (rootless, a file system overlayfs cannot
    sit on) is bound as it is and named in ``notes``. Not one overlay of ``/``:
    rootless the kernel refuses that (``/`` holds mounts made outside the user
    namespace). Returns where the old root now is (detached by the caller, once the
    kept paths are bound from it) and the directories that got a writable layer."""
    mounts = [(p, t) for p, t in _mount_points() if p != "/"]
    place = _Placer(scratch, [p for p, _ in mounts], dict(mounts), as_is or [], notes)
    place.covered = covered or []
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    new = f"{scratch}/root"
    try:
        os.mkdir(new)
        _mount("tmpfs", new, "tmpfs", MS_NODEV, "mode=0755")
        place.new = new
        for name in sorted(os.listdir("/")):
            place.top(f"/{name}")
        os.mkdir(f"{new}/{OLD_ROOT}")
        os.chdir(new)
        if libc.syscall(SYS_PIVOT_ROOT, b".", os.fsencode(OLD_ROOT)):
            raise Refused(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    except BaseException:
        os.chdir("/")
        libc.umount2(os.fsencode(scratch), MNT_DETACH)  # the host's root stays as it was
        raise
    os.chdir("/")
    return "/" + OLD_ROOT, place.layers


class _Placer:
    """The host's root, entry by entry, into the new root (see _new_root)."""

    def __init__(
        self,
        scratch: str,
        points: list[str],
        fstypes: dict[str, str],
        as_is: list[str],
        notes: list[str] | None,
    ) -> None:
        self.scratch, self.points, self.fstypes = scratch, points, fstypes
        self.as_is, self.notes = as_is, notes if notes is not None else []
        self.new = ""
        self.layers: list[str] = []
        self.tried = 0
        self.covered: list[str] = []  # masked later: never layered

    def top(self, path: str) -> None:
        """One top-level entry of the host's root."""
        target = self.new + path
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
            return
        if not os.path.isdir(path):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                open(target, "w").close()
                _mount(path, target, None, MS_BIND | MS_REC)
            return
        os.mkdir(target)
        os.chmod(target, os.stat(path).st_mode & 0o7777)
        if path != self.scratch:  # the private /tmp goes there
            self.directory(path, target)

    def directory(self, path: str, target: str) -> None:
        """A directory (a mount point or not) layered, with the mount points inside it
        placed in turn; or bound as it is, with everything below it."""
        if self._layerable(path):
            self.tried += 1  # a refused layer leaves its directories: never reused
            layer = f"{self.scratch}/layers/{self.tried}"
            os.makedirs(f"{layer}/upper")
            os.mkdir(f"{layer}/work")
            options = f"lowerdir={path},upperdir={layer}/upper,workdir={layer}/work"
            try:
                _mount("overlay", target, "overlay", MS_NODEV, options)
            except Refused as exc:
                if path in self.points:
                    self.notes.append(
                        f"{path} is the host's mount as it is (no layer: {exc}): "
                        "Unix sockets under it are reachable"
                    )
            else:
                self.layers.append(path)
                inside = [p for p in self.points if p != path and _under(p, path)]
                for point in _outermost(list(dict.fromkeys(inside))):
                    self.mount_point(point)
                return
        _mount(path, target, None, MS_BIND | MS_REC)

    def mount_point(self, point: str) -> None:
        """A mount point inside a layered directory."""
        target = self.new + point
        try:
            mode = os.stat(point).st_mode
        except OSError:
            return
        if stat.S_ISSOCK(mode):  # a host daemon's socket bound here: left out
            return
        _mount_point(point, target)
        if stat.S_ISDIR(mode):
            self.directory(point, target)
        else:
            _mount(point, target, None, MS_BIND | MS_REC)

    def _layerable(self, path: str) -> bool:
        if any(_under(path, top) for top in self.covered):
            return False
        if any(_under(path, own) or _under(own, path) for own in self.as_is):
            return path not in self.points  # /etc holds /etc/hosts: layered, not /opt/ml
        return self.fstypes.get(path) not in NOT_LAYERED


def _mount_point(source: str, target: str) -> None:
    """Something to mount ``source`` on at ``target``: a directory or an empty file."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def _detach(old_root: str) -> list[str]:
    """The host's root, left below the new one by pivot_root, made unreachable."""
    if libc.umount2(os.fsencode(old_root), MNT_DETACH) == 0:
        os.rmdir(old_root)
        return []
    why = os.strerror(ctypes.get_errno())
    _mount("tmpfs", old_root, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0")  # hidden
    return [f"the host's root is covered, not detached, at {old_root}: {why}"]


def _private_dev(names: list[str]) -> list[str]:
    """A ``/dev`` of the instance's own (as a container's): a tmpfs holding only the
    host's ``names`` (glob patterns: null, zero, the GPUs, ...) bound back, a devpts of its
    own and the usual links. The host's ``/dev`` holds its disks, which uid 0 opens by file
    permission alone, no capability needed: the raw disk would be the whole host."""
    fds: dict[str, int] = {}
    for pattern in names:
        for path in expand(os.path.join("/dev", pattern)):
            try:
                fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                pass
    try:
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    except Refused as exc:
        for fd in fds.values():
            os.close(fd)
        return [f"/dev is the host's (its disks included): {exc}"]
    missing = []
    for path, fd in sorted(fds.items()):
        try:
            _bind(fd, path, read_only=False)
        except (Refused, OSError) as exc:
            missing.append(f"{path} is not there: {exc}")
        os.close(fd)
    for name, target in DEV_LINKS:
        os.symlink(target, f"/dev/{name}")
    for name in ("pts", "shm"):
        os.mkdir(f"/dev/{name}", 0o755)
    try:
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, DEVPTS_OPTIONS)
    except Refused as exc:
        missing.append(f"no terminals of its own: {exc}")
    return missing


def _host_mounts_read_only(writable: list[str], layers: list[str]) -> list[str]:
    """Every mount the new root took from the host (``/sys``, ``/dev``, other disks) made
    read-only, except the instance's own (its tree, ``/proc``, ``/dev/pts``, masks):
    the overlay root is the only place a write goes, and it goes away."""
    missing = []
    for point, fstype in _mount_points():
        if point == "/" or point in layers or fstype in NEVER_READ_ONLY:
            continue
        if not os.path.exists(point):
            continue
        if any(_under(point, top) for top in writable):
            continue
        try:
            _read_only(point)
        except (Refused, OSError) as exc:
            missing.append(f"{point} is the host's, writable: {exc}")
    return missing


def _kernel_settings_read_only(paths: list[str] | tuple[str, ...]) -> list[str]:
    """runc's read-only paths (``/proc/sys``, ``/proc/sysrq-trigger``, ``/proc/irq``,
    ``/proc/bus``, ``/proc/fs``) read-only: uid 0 may write most of them by file
    permission alone, without any capability."""
    missing = []
    for path in paths:
        if not os.path.exists(path):  # a kernel without magic SysRq
            continue
        try:
            _mount(path, path, None, MS_BIND | MS_REC)
            _read_only(path)
        except (Refused, OSError) as exc:
            missing.append(f"{path} is writable: {exc}")
    return missing


def _masks(proc: list[str], secrets: list[str]) -> list[str]:
    """runc's masked paths and the host's secrets (shipyard.sandbox.masks): a directory
    covered by an empty read-only tmpfs, a file by ``/dev/null``, read-only."""
    missing = []
    paths = [*proc, *(p for pattern in secrets for p in expand(pattern))]
    for path in paths:
        try:
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0")
            elif os.path.exists(path):  # reads as empty, as runc's masks do
                _mount("/dev/null", path, None, MS_BIND)
                kept = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
                _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
        except (Refused, OSError) as exc:
            missing.append(f"{path} is visible: {exc}")
    return missing


def _overlay(directory: str, scratch: str = "/tmp") -> None:
    """A writable in-memory layer over ``directory`` (the fallback where the root cannot be
    one). Its tmpfs is mounted over ``scratch`` (in this mount namespace only: the host's
    is untouched) and detached once the overlay holds it, so nothing of it is visible
    anywhere else. Mounts below ``directory`` (``/etc/hosts``) are bound again on top."""
    below = [p for p, _ in _mount_points() if p != directory and _under(p, directory)]
    fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in _outermost(below)}
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    try:
        os.mkdir(f"{scratch}/upper")
        os.mkdir(f"{scratch}/work")
        options = f"lowerdir={directory},upperdir={scratch}/upper,workdir={scratch}/work"
        _mount("overlay", directory, "overlay", MS_NOSUID | MS_NODEV, options)
        for point, fd in fds.items():
            _mount(f"/proc/self/fd/{fd}", point, None, MS_BIND | MS_REC)
    finally:
        libc.umount2(os.fsencode(scratch), MNT_DETACH)
        for fd in fds.values():
            os.close(fd)
