"""The tenant code the platform runs outside a session (the publish-time inspector,
sandbox/inspector.py, and the environment pages' prompt renderer, sandbox/prompt_render.py) in the
same sandbox as the workers.

It sees the package (read-only, at the neutral PACKAGE, not at the host's path), the Python
runtime and the platform modules it runs (the child module, loader.py and the OpenEnv adapter
sandbox/openenv_host.py, which import no Django), and nothing else: no settings, no database, no other package, no network, no process of
the platform (its own pid namespace, so no /proc/<pid>/environ either). Nothing of the host is
writable from it: its one writable place is the sandbox's private, sized /tmp, gone with it. Its
input comes on stdin and its results go back on stdout (executors/inspection.py), so the platform
never opens a file the child could have touched.
"""

from __future__ import annotations

from pathlib import Path

from orsplatform.sandbox import binding, users
from orsplatform.sandbox.bwrap import data_binds, python_of, sandboxed
from orsplatform.sandbox.cgroups import WorkerCgroup
from orsplatform.sandbox.config import Limits, SandboxConfig

PACKAGE = "/ors/env"
# The child modules, by the name run_child is given.
CHILDREN = {"inspector": "orsplatform.sandbox.inspector", "prompt_render": "orsplatform.sandbox.prompt_render"}
# Runs a child module with /ors/lib first on the path (-I ignores PYTHONPATH).
BOOT = ("import runpy, sys; sys.path.insert(0, '" + binding.LIB + "'); "
        "runpy.run_module('{module}', run_name='__main__', alter_sys=True)")


def child_command(config: SandboxConfig, *, module: str, package_dir: Path, args: list[str],
                  memory_bytes: int, file_bytes: int, runtime: str | None = None,
                  cgroup: WorkerCgroup | None = None) -> list[str]:
    """argv running the child `module` (CHILDREN) in the sandbox as `<module> PACKAGE <args...>`."""
    dotted = CHILDREN[module]
    users.readable(str(package_dir))
    binds = [
        "--ro-bind", str(package_dir), PACKAGE,
        *binding.module_binds((dotted, *binding.CHILD_MODULES)),
        *data_binds(str(package_dir)),  # /orwd_data: a class may list its tasks from its data
    ]
    # /tmp is a tmpfs: what the child writes there is memory, so it gets a worker's default size
    # (ORS_SANDBOX_TMP_MB), not the validation's larger per-file limit.
    limits = Limits(memory_bytes=memory_bytes, cpu_seconds=config.defaults.cpu_seconds,
                    processes=config.defaults.processes, open_files=config.defaults.open_files,
                    tmp_bytes=min(file_bytes, config.defaults.tmp_bytes))
    argv = [python_of(config, runtime), "-I", "-c", BOOT.format(module=dotted), PACKAGE, *args]
    env = {"ORS_INSPECT_MEMORY_BYTES": str(memory_bytes), "ORS_INSPECT_FILE_BYTES": str(file_bytes)}
    return sandboxed(config, limits, binds, argv, env, runtime=runtime, chdir=PACKAGE, cgroup=cgroup)
