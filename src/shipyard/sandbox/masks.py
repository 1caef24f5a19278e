"""What of the kernel's and the host's an instance never sees (built by shipyard.sandbox.init).

Data only, so it is tested as data; the instance's init applies it:

* ``proc_mask``: runc's masked paths, each covered by an empty read-only tmpfs
  (directories) or ``/dev/null`` (files): ``/proc/kcore`` (the kernel's memory),
  ``/proc/keys`` (every key's description, whoever owns it), ``/proc/timer_list`` and
  ``/proc/sched_debug`` (other processes' timers and tasks, names included),
  ``/sys/firmware`` (ACPI tables, EFI variables), RAPL energy counters (the Platypus
  side channel), ...;
* ``proc_read_only``: runc's read-only paths, bound read-only over themselves: a
  capability-less uid 0 writes ``/proc/irq/*/smp_affinity``, ``/proc/sys`` and
  ``/proc/sysrq-trigger`` by file mode alone;
* ``secrets``: host files whose content is a secret of the host (password hashes, the
  ssh host keys that let anyone impersonate this machine, TLS private keys), covered by
  ``/dev/null`` (glob patterns; a directory is covered by an empty tmpfs);
* ``fresh``: ``/run`` and ``/var/run`` (where it is a directory of its own) as the
  instance's own empty tmpfs: the host's daemons' Unix sockets live there
  (``docker.sock``, D-Bus, systemd's private socket), and a read-only bind does not
  refuse ``connect()``; ``keep_own`` are the instance's own files the agent bound below
  them (``/etc/resolv.conf`` is a link into ``/run`` on systemd-resolved hosts), bound
  back.
"""

from __future__ import annotations

import os

PROC_MASKED = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
PROC_READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_*key",
    "/etc/ssl/private",
)
FRESH = ("/run", "/var/run")
# the instance's own files the agent binds (shipyard.sandbox.instance)
OWN_FILES = ("/etc/hosts", "/etc/resolv.conf")


def view_keys() -> dict[str, list[str]]:
    """The masks of an instance's view (keys of shipyard.sandbox.fsview.view)."""
    fresh = [p for p in FRESH if os.path.isdir(p) and not os.path.islink(p)]
    own = sorted(
        {
            os.path.realpath(p)
            for p in OWN_FILES
            if any(_under(os.path.realpath(p), top) for top in fresh)
        }
    )
    return {
        "proc_mask": list(PROC_MASKED),
        "proc_read_only": list(PROC_READ_ONLY),
        "secrets": list(SECRETS),
        "fresh": fresh,
        "keep_own": own,
    }


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
