"""The folders bubblewrap makes on the way to a mount point, made searchable by the sandbox's user.

bubblewrap creates the missing parents of every destination in the sandbox's root. Up to 0.8
(Debian 12's) it derives their mode from the operation's permissions, which for a bind are left at
0, so the parents of /ors/venv/lib or /etc/ld.so.cache come out 0700: invisible to the unprivileged
user tenant code runs as (users.py). So each such parent is made first, explicitly, as 0755 with
``--perms 0755 --dir``, placed before the operation (and before its ``--size``/``--perms``, which
bind to the operation that follows them).
"""

from __future__ import annotations

import posixpath

FLAGS = {"--unshare-all", "--unshare-user", "--unshare-user-try", "--unshare-ipc", "--unshare-pid",
         "--unshare-net", "--unshare-uts", "--unshare-cgroup", "--unshare-cgroup-try", "--share-net",
         "--disable-userns", "--die-with-parent", "--new-session", "--clearenv", "--as-pid-1"}
ONE = {"--hostname", "--cap-drop", "--cap-add", "--chdir", "--remount-ro", "--userns", "--seccomp", "--args",
       "--unsetenv", "--uid", "--gid"}
MODIFIERS = {"--size", "--perms"}  # one argument each, for the operation that follows
DEST_ONE = {"--proc", "--dev", "--tmpfs", "--dir", "--mqueue"}
DEST_TWO = {"--ro-bind", "--bind", "--dev-bind", "--ro-bind-try", "--bind-try", "--dev-bind-try", "--symlink",
            "--ro-bind-data", "--bind-data", "--file", "--setenv"}  # --setenv: two arguments, no mount


def with_parents(args: list[str]) -> list[str]:
    """`args` (bubblewrap's options, without the program) with every parent folder a destination
    needs made first as 0755. Raises ValueError on an option it does not know, so a new one is
    looked at here rather than passed through unseen."""
    out: list[str] = []
    made: set[str] = {"/"}
    pending: list[str] = []  # modifiers waiting for their operation
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in MODIFIERS:
            pending += args[i:i + 2]
            i += 2
            continue
        if arg in FLAGS:
            width, dest = 1, None
        elif arg in ONE:
            width, dest = 2, None
        elif arg in DEST_ONE:
            width, dest = 2, args[i + 1]
        elif arg in DEST_TWO:
            width, dest = 3, (None if arg == "--setenv" else args[i + 2])
        else:
            raise ValueError(f"mount_parents does not know bubblewrap's {arg!r}")
        if dest is not None:
            for parent in _parents(posixpath.normpath(dest)):
                if parent not in made:
                    out += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            made.add(posixpath.normpath(dest))
        out += [*pending, *args[i:i + width]]
        pending = []
        i += width
    return out + pending


def _parents(path: str) -> list[str]:
    """/a/b/c -> [/a, /a/b] (shallowest first)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:n]) for n in range(1, len(parts))]
