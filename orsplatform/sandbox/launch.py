"""The exec wrapper in front of bubblewrap: ``python -I -S launch.py SPEC_JSON``.

Run by the supervisor for every sandboxed process (workers, the inspector, the prompt renderer,
the build sandbox). In this order, before anything of the tenant exists:

1. joins the worker's cgroups (so bubblewrap and everything it forks is counted from the start);
2. dies with its supervisor (PR_SET_PDEATHSIG; bubblewrap's --die-with-parent carries it on);
3. when run as root, makes the sandbox's user namespace: the sandbox's user is an unused host uid
   of its own, never the host's root (users.py), and gives it the folders it may write;
4. sets the rlimits;
5. when root, rebinds the host folders and files bubblewrap binds at other names from read-only
   overlays mounted in a mount namespace of its own, so /proc/self/mountinfo inside names none of
   their host paths (``_stage``);
6. hands bubblewrap its options, the syscall filter and generated files through memfds
   (``--args FD``, ``--seccomp FD``, ``--ro-bind-data FD``), so /proc/1/cmdline inside the sandbox
   names no host path, and the files to copy into the sandbox as open descriptors (``--file FD``);
7. closes every other descriptor it inherited (an event loop such as uvloop passes inheritable
   descriptors on even with close_fds=True; a listening socket must never reach tenant code);
8. execs bubblewrap.

Standard library only, and nothing imported that -S leaves out: it starts once per worker.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import stat
import sys

PR_SET_PDEATHSIG = 1
SIGKILL = 9
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x1, 0x2, 0x4, 0x4000, 0x40000


def _user_namespace(user: dict) -> int:
    """A user namespace mapping its root to the host's (bubblewrap mounts as it) and
    ``user["inside"]`` to the unused host uid ``user["base"]`` + this pid (the sandbox's, which
    bubblewrap keeps), with no nested user namespaces allowed in it; its descriptor, for
    bubblewrap's --userns. A child makes it (a process cannot map others' ids into its own), this
    process writes the maps, and the child goes: the descriptor keeps the namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    host = user.get("host") or user["base"] + os.getpid()
    made_r, made_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(made_r)
            os.close(done_w)
            if libc.unshare(CLONE_NEWUSER) != 0:
                os._exit(1)
            os.write(made_w, b"1")
            os.read(done_r, 1)  # the maps are written: cap nested namespaces in this one
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0")
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(made_w)
    os.close(done_r)
    try:
        if os.read(made_r, 1) != b"1":
            raise OSError("could not make the sandbox's user namespace")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(f"0 0 1\n{user['inside']} {host} 1\n")
        fd = os.open(f"/proc/{child}/ns/user", os.O_RDONLY)
        os.write(done_w, b"1")
    finally:
        os.close(made_r)
        os.close(done_w)
        _, status = os.waitpid(child, 0)
    if status != 0:
        os.close(fd)
        raise OSError("could not cap user namespaces in the sandbox's")
    for path in user.get("owned", ()):
        _own(path, host)
    return fd


def _own(top: str, uid: int) -> None:
    """The build sandbox's writable folder, given to its host uid: what is not its already (never
    following a link). Its folders stay searchable by others: the next sandbox's bubblewrap binds
    from them as a root whose rights end at files of uids its namespace maps."""
    def give(path: str) -> None:
        st = os.lstat(path)
        if st.st_uid != uid or st.st_gid != uid:
            os.chown(path, uid, uid, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o005 != 0o005:
            os.chmod(path, stat.S_IMODE(st.st_mode) | 0o005)

    give(top)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            give(os.path.join(dirpath, name))


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    import ctypes

    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data is not None else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _stage_sources(args: list[str]) -> dict[int, tuple[str, str]]:
    """The read-only binds to stage: option index -> (host folder to overlay, name in it, or "" for
    the folder itself). Binds at the same path inside (/usr, /etc/...) name nothing of the host's
    layout; a device (/dev/null over /proc/locks) is no folder's."""
    found: dict[int, tuple[str, str]] = {}
    i = 0
    while i < len(args):
        if args[i] == "--ro-bind" and i + 2 < len(args) and args[i + 1] != args[i + 2]:
            real = os.path.realpath(args[i + 1])
            if os.path.isdir(real):
                found[i + 1] = (real, "")
            elif os.path.isfile(real):
                found[i + 1] = (os.path.dirname(real), os.path.basename(real))
        i += 1
    return found


def _stage(args: list[str], root: str) -> list[str]:
    """`args` with each staged bind's source replaced by a read-only overlay of it. A bind shows its
    source's path on its filesystem (/work/.../.venv/lib) in the sandbox's /proc/self/mountinfo,
    whatever name it is first rebound at; an overlay is a filesystem of its own, shown as "/" with
    its layers named as this process's descriptors (/proc/self/fd/N). The overlays live in a mount
    namespace of this process's own (bubblewrap's is made from it) under `root`, a tmpfs there,
    and go with the sandbox. Without it (no overlayfs, not root) a source is bound as it is."""
    import ctypes

    found = _stage_sources(args)
    if not found:
        return args
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        _mount(libc, "none", "/", None, MS_REC | MS_PRIVATE)  # nothing of this reaches the host's
        os.makedirs(root, mode=0o700, exist_ok=True)
        _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=64k")
        os.mkdir(os.path.join(root, "e"))
        # overlayfs wants two layers when it has no upper one: an empty folder under the source.
        empty = os.open(os.path.join(root, "e"), os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return args
    out = list(args)
    staged: dict[str, str] = {}
    for index, (folder, name) in found.items():
        if folder not in staged:
            target = os.path.join(root, str(len(staged)))
            try:
                fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
                try:
                    os.mkdir(target)
                    _mount(libc, "overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                           f"lowerdir=/proc/self/fd/{fd}:/proc/self/fd/{empty}")
                finally:
                    os.close(fd)
            except OSError:
                target = ""
            staged[folder] = target
        if staged[folder]:
            out[index] = os.path.join(staged[folder], name) if name else staged[folder]
    os.close(empty)
    return out


def _die_with_parent(parent: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before the line above took effect
        os._exit(1)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: bubblewrap reads it after the exec
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_all_but(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _sweep(root: str) -> None:
    """Remove the bundles of gVisor sandboxes whose launcher is gone (killed before it could)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name.split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove(os.path.join(root, name))


def _remove(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _bundle(gvisor: dict, user: dict | None) -> str:
    """Write the OCI bundle of a gVisor sandbox (gvisor.py drew its spec from bubblewrap's plan):
    a read-only root holding the links and folders, the generated files, and config.json."""
    root = gvisor["state_root"]
    os.makedirs(root, mode=0o700, exist_ok=True)
    _sweep(root)
    import tempfile

    bundle = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root)
    os.chmod(bundle, 0o711)  # gVisor's gofer reads the root and files below as root; nobody else lists it
    rootfs = os.path.join(bundle, "rootfs")
    os.mkdir(rootfs, 0o755)
    oci = gvisor["oci"]
    for name, target in gvisor["root_links"]:
        os.symlink(target, os.path.join(rootfs, name))
    for target, path in oci.pop("links"):
        inside = os.path.join(rootfs, path.lstrip("/"))
        if not target:
            os.makedirs(inside, mode=0o755, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
        if not os.path.lexists(inside):
            os.symlink(target, inside)
    files = os.path.join(bundle, "files")
    os.mkdir(files, 0o755)
    for n, (dest, content) in enumerate(gvisor.get("files", ())):
        path = os.path.join(files, str(n))
        with open(path, "w") as f:
            f.write(content)
        os.chmod(path, 0o444)
        oci["mounts"].append({"destination": dest, "type": "bind", "source": path, "options": ["rbind", "ro"]})
    for source, dest in gvisor.get("copies", ()):
        oci["mounts"].append({"destination": dest, "type": "bind", "source": source, "options": ["rbind", "ro"]})
    host = (user or {}).get("host") or (user or {}).get("base", 0) + os.getpid()
    if user:
        oci["process"]["user"] = {"uid": host, "gid": host}
        for path in user.get("owned", ()):
            _own(path, host)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(oci, f)
    return bundle


def _run_gvisor(spec: dict) -> None:
    """Run the sandbox under runsc and remove its bundle after: runsc is a child that dies with
    this process (which dies with the supervisor), and its sandbox dies with runsc."""
    gvisor = spec["gvisor"]
    try:
        bundle = _bundle(gvisor, spec.get("user"))
    except OSError as exc:
        print(f"could not prepare the gVisor sandbox: {exc}", file=sys.stderr)
        os._exit(126)
    argv = [gvisor["runsc"], "--root", os.path.join(bundle, "state"), *gvisor["flags"], "run",
            "--bundle", bundle, "ors-" + os.path.basename(bundle)]
    child = os.fork()
    if child == 0:
        try:
            _die_with_parent(os.getppid())
            _close_all_but({0, 1, 2})
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    _close_all_but({2})
    os.close(0)
    os.close(1)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    _remove(bundle)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        for procs in spec.get("cgroups", ()):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        print(f"could not enter the worker's cgroup: {exc}", file=sys.stderr)
        os._exit(126)
    if spec.get("parent"):
        _die_with_parent(spec["parent"])
    if spec.get("gvisor"):
        _run_gvisor(spec)
    keep = {0, 1, 2}
    options: list[str] = []
    if spec.get("user"):
        try:
            fd = _user_namespace(spec["user"])
        except OSError as exc:
            print(f"could not make the sandbox's user namespace: {exc}", file=sys.stderr)
            os._exit(126)
        keep.add(fd)
        options += ["--userns", str(fd)]
    bwrap_args = spec["bwrap"][1:]
    if spec.get("stage"):
        bwrap_args = _stage(bwrap_args, spec["stage"])
    if spec.get("seccomp"):
        fd = _memfd("seccomp", base64.b64decode(spec["seccomp"]))
        keep.add(fd)
        options += ["--seccomp", str(fd)]
    for dest, content in spec.get("files", ()):
        fd = _memfd("file", content.encode())
        keep.add(fd)
        # Readable by the sandbox's user (bubblewrap's default, 0600, is its root's alone) and
        # their parent folders with them (bubblewrap makes those from the file's mode).
        options += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
    # Copied into the sandbox's root (which is then remounted read-only): bubblewrap reads them
    # from these descriptors, so no mount names their host paths.
    for source, dest in spec.get("copies", ()):
        try:
            fd = os.open(source, os.O_RDONLY)
        except OSError as exc:
            print(f"could not open a file of the package: {exc.strerror}", file=sys.stderr)
            os._exit(126)
        keep.add(fd)
        options += ["--perms", "0555" if os.fstat(fd).st_mode & 0o111 else "0444", "--file", str(fd), dest]
    args = _memfd("args", b"".join(a.encode() + b"\0" for a in [*options, *bwrap_args]))
    keep.add(args)
    for fd in keep - {0, 1, 2}:
        os.set_inheritable(fd, True)
    _close_all_but(keep)
    for name, value in spec.get("rlimits", ()):
        resource.setrlimit(getattr(resource, name), (value, value))
    bwrap = spec["bwrap"][0]
    os.execv(bwrap, [bwrap, "--args", str(args), *spec["argv"]])


if __name__ == "__main__":
    main()
