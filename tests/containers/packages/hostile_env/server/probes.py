"""What a hostile tenant tries from inside its container. Each probe returns what it reached."""

import ctypes
import errno
import os
import platform
import socket
import subprocess
import time

libc = ctypes.CDLL(None, use_errno=True)


def _errno(result: int) -> str:
    return "ok" if result == 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def read(paths: str, n: int) -> dict:
    found = {}
    for path in paths.split(","):
        try:
            with open(path, "rb") as f:
                found[path] = f.read(200).decode("utf-8", "replace")
        except OSError as exc:
            found[path] = f"error: {exc.strerror}"
    return {"files": found, "mounts": open("/proc/mounts").read()[:4000], "environ": dict(os.environ)}


def connect(targets: str, n: int) -> dict:
    out = {}
    for target in targets.split(","):
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=3):
                out[target] = "connected"
        except OSError as exc:
            out[target] = f"error: {exc.strerror or exc}"
    try:
        out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    except OSError as exc:
        out["interfaces"] = f"error: {exc}"
    return out


def fork(arg: str, n: int) -> dict:
    children, stopped = [], None
    for _ in range(n):
        try:
            children.append(subprocess.Popen(["sleep", "60"]))
        except OSError as exc:
            stopped = exc.strerror
            break
    for child in children:
        child.kill()
        child.wait()
    return {"forked": len(children), "stopped": stopped}


def fill(arg: str, n: int) -> dict:
    written, stopped = 0, None
    chunk = os.urandom(1 << 20)
    try:
        with open("/workspace/fill", "wb") as f:
            for _ in range(n):
                f.write(chunk)
                written += 1
    except OSError as exc:
        stopped = exc.strerror
    finally:
        try:
            os.unlink("/workspace/fill")
        except OSError:
            pass
    return {"written_mb": written, "stopped": stopped}


def syscalls(arg: str, n: int) -> dict:
    nr = {"kexec_load": 246, "init_module": 175, "open_by_handle_at": 304, "bpf": 321, "perf_event_open": 298,
          "keyctl": 250, "add_key": 248, "ptrace": 101, "mount": 165, "swapon": 167, "reboot": 169,
          "iopl": 172, "ioperm": 173, "userfaultfd": 323}
    out = {}
    for name, number in nr.items():
        ctypes.set_errno(0)
        result = libc.syscall(number, 0, 0, 0, 0, 0)
        out[name] = _errno(result)
    out["kernel"] = platform.release()
    out["dmesg"] = subprocess.run(["sh", "-c", "cat /proc/version"], capture_output=True, text=True).stdout.strip()
    return out


def sleep(arg: str, n: int) -> dict:
    time.sleep(n)
    return {"slept": n}


def run(probe: str, arg: str, n: int) -> dict:
    return {"read": read, "connect": connect, "fork": fork, "fill": fill, "syscalls": syscalls,
            "sleep": sleep}[probe](arg, n)
