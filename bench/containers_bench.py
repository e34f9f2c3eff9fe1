"""Container environments, side by side with the same image run directly by Docker, in one run.

    .venv/bin/python bench/containers_bench.py --concurrency 16 --duration 20
    .venv/bin/python bench/containers_bench.py --builds          # also coding_env's build, cold and warm

The image is tests/containers/packages/ledger_env (OpenEnv's layout, its own openenv, built by the
platform's build service). Figures, each from this one invocation:

- episodes/s at the given concurrency, unmodified ``GenericEnvClient``s playing one-step episodes
  (``reset(start=0)``, ``step(amount=10)``: reward 10, done), (1) against the image run by Docker
  with its own command (OpenEnv's server, ``runc``, the engine's host network, clients beside it in
  the engine's network namespace), then (2) against the platform (``/openenv/builtin/ledger``: API
  key, audit log, the container under gVisor, spoken to over its stdio); the ratio platform/reference;
  (3) against the same image and command under gVisor without the platform (its file system as an OCI
  bundle, ``runsc run`` with the platform's runsc flags and the host's network), which splits that
  ratio into the runtime's part and the platform's own (``--no-gvisor-reference`` skips it);
- cold start: a version's first session (no container yet: start under gVisor, the image's server
  up, the session reset) and a further session on the warm container, connect to first observation;
- memory of an idle container (its cgroup's usage once its sessions ended);
- with ``--builds``: OpenEnv's ``envs/coding_env`` (from the OpenEnv checkout named by
  ``--openenv-repo``) built by the build service cold (``--no-cache``) and warm (one source file
  changed, BuildKit's cache as the first build left it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from bench import cpu_split  # noqa: E402
from bench.compare import (  # noqa: E402
    ROOT,
    free_port,
    manage,
    platform_command,
    platform_env,
    prepare_platform,
)
from bench.openenv_compare import Recorder, database, pct, server_process  # noqa: E402

PACKAGE = ROOT / "tests" / "containers" / "packages" / "ledger_env"


async def _worker(url: str, headers: dict[str, str], rec: Recorder, stop: float) -> None:
    async with GenericEnvClient(base_url=url, headers=headers, message_timeout_s=120) as client:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            try:
                await client.reset(start=0)
                t1 = time.monotonic()
                step = await client.step({"amount": 10})
                t2 = time.monotonic()
            except Exception as exc:
                if time.monotonic() < stop:
                    rec.error(type(exc).__name__ + ": " + str(exc)[:80])
                return
            if step.reward != 10.0 or not step.done:
                rec.error(f"unexpected result reward={step.reward} done={step.done}")
            elif rec.measuring(t0, t2):
                rec.episodes += 1
                rec.latencies["reset"].append(t1 - t0)
                rec.latencies["step"].append(t2 - t1)


async def load(url: str, headers: dict[str, str], concurrency: int, duration: float, warmup: float) -> dict:
    rec = Recorder()
    now = time.monotonic()
    rec.start, rec.end = now + warmup, now + warmup + duration
    await asyncio.gather(*[_worker(url, headers, rec, rec.end) for _ in range(concurrency)])
    return {"concurrency": concurrency, "episodes": rec.episodes, "episodes_per_s": rec.episodes / duration,
            "reset_p50_ms": pct(rec.latencies["reset"], 50), "step_p50_ms": pct(rec.latencies["step"], 50),
            "step_p99_ms": pct(rec.latencies["step"], 99), "errors": rec.errors}


async def first_observation(url: str, headers: dict[str, str]) -> tuple[float, GenericEnvClient]:
    """Seconds from connecting to the reset's observation; the client, still open."""
    t0 = time.monotonic()
    client = GenericEnvClient(base_url=url, headers=headers, connect_timeout_s=120, message_timeout_s=120)
    await client.connect()
    await client.reset(start=0)
    return time.monotonic() - t0, client


def image_of(engine, slug: str = "ledger") -> str:
    from orsplatform.containers.images import record_read

    packages = Path(os.environ.get("ORS_PACKAGE_DIR", ROOT / "var" / "packages"))
    records = sorted(packages.glob("*.image"), key=lambda p: p.stat().st_mtime)
    for record in reversed(records):
        got = record_read(str(record)[:-len(".image")])
        if got is not None:
            return got.image
    raise SystemExit("no container image recorded")


def idle_memory_mb(engine, image: str) -> list[float]:
    ids = engine.run("ps", "-q", "--no-trunc", "--filter", "label=ors.container", "--filter",
                     f"ancestor={image}").stdout.decode().split()
    out = []
    for cid in ids:
        parent = (engine.cgroup_parent or "/docker").strip("/")  # the platform's engine: its own parent
        for path in (f"/sys/fs/cgroup/memory/{parent}/{cid}/memory.usage_in_bytes",
                     f"/sys/fs/cgroup/{parent}/{cid}/memory.current"):
            with contextlib.suppress(OSError, ValueError):
                out.append(int(Path(path).read_text()) / 1e6)
                break
    return out


@contextlib.contextmanager
def reference(engine, image: str):
    """The image's own command (OpenEnv's server) on a free port, run by Docker with runc."""
    port = free_port()
    name = f"ors-bench-ref-{port}"
    engine.run("run", "-d", "--rm", "--name", name, "--network", "host", image, "uvicorn",
               "ledger_env.server.app:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
               "--no-access-log", timeout=120)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        engine.run("rm", "-f", name, check=False, timeout=60)


@contextlib.contextmanager
def reference_gvisor(engine, image: str, workdir: Path):
    """The same image and command under gVisor without the platform: the image's file system as an OCI
    bundle, ``runsc run`` with the platform's runsc flags and the host's network (what ``docker run
    --runtime=runsc --network=host`` gives), so clients reach it as they reach the runc reference.
    Measured beside the runc reference, it splits the platform's ratio into the runtime's part and
    the platform's own."""
    from orsplatform.containers.runtime import runsc_global_flags, runsc_path

    port = free_port()
    bundle, state = workdir / "ref-bundle", workdir / "ref-runsc"
    (bundle / "rootfs").mkdir(parents=True)
    state.mkdir()
    cid = engine.run("create", image, "true").stdout.decode().strip()
    try:
        exported = engine.run("export", cid, timeout=600).stdout
    finally:
        engine.run("rm", "-f", cid, check=False)
    subprocess.run(["tar", "-x", "-C", str(bundle / "rootfs")], input=exported, check=True)
    config = json.loads(engine.run("image", "inspect", image).stdout)[0]["Config"]
    runsc = [runsc_path() or "runsc", f"--root={state}", *runsc_global_flags(), "--network=host"]
    subprocess.run([*runsc, "spec", "--bundle", str(bundle), "--", "uvicorn", "ledger_env.server.app:app",
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                   check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, env=config.get("Env") or [], cwd=config.get("WorkingDir") or "/")
    spec["root"]["readonly"] = False
    # The host's network: no network namespace of its own (runsc's default spec makes an empty one).
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
    (bundle / "config.json").write_text(json.dumps(spec))
    name = f"ors-bench-gvisor-{port}"
    proc = subprocess.Popen([*runsc, "run", "--bundle", str(bundle), name], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "ref-gvisor.log", "ab"))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run([*runsc, "kill", name, "KILL"], capture_output=True)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run([*runsc, "delete", "--force", name], capture_output=True)


def wait_spare(engine, image: str, count: int = 1, timeout: float = 300) -> float:
    """Seconds until ``count`` containers of the image answer on their loopback: the version's spare
    (containers/warm.py; the server started after the build here, so the spare starts now, as it
    does when a build ends), and after a session took it, the next one (not measured while it
    imports its server: that start would take the load's CPU)."""
    t0 = time.monotonic()
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
    while time.monotonic() - t0 < timeout:
        ids = engine.run("ps", "-q", "--filter", "label=ors.container", "--filter", f"ancestor={image}").stdout.split()
        if len(ids) >= count and all(engine.run("exec", i.decode(), "python3", "-c", probe, check=False).returncode == 0
                                     for i in ids):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"{count} container(s) of the image did not answer (ORS_CONTAINER_WARM_VERSIONS=0?)")


def reference_load(engine, url: str, args: argparse.Namespace) -> dict:
    """This script's --load-only, inside the engine's network namespace (where the reference listens)."""
    prefix = ["nsenter", f"--net=/run/netns/{engine.netns}"] if engine and engine.netns else []
    out = subprocess.run([*prefix, sys.executable, __file__, "--load-only", url, "--concurrency",
                          str(args.concurrency), "--duration", str(args.duration), "--warmup", str(args.warmup)],
                         capture_output=True, timeout=args.duration + args.warmup + 300, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(out.stderr.decode()[-3000:])
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def wait_reference(engine, url: str, timeout: float = 120) -> None:
    prefix = ["nsenter", f"--net=/run/netns/{engine.netns}"] if engine and engine.netns else []
    deadline = time.monotonic() + timeout
    probe = f"import urllib.request; urllib.request.urlopen('{url}/health', timeout=1)"
    while subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit("the reference did not answer /health")
        time.sleep(0.2)


def run_platform(args: argparse.Namespace, engine, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with database(args, workdir) as db:
        env = {**platform_env(db), "ORS_CONTAINERS_DIR": str(engine.state),
               **({"ORS_CONTAINER_WARM_VERSIONS": "0"} if args.no_spares else {}),
               "ORS_PACKAGE_DIR": str(workdir / "packages"), "ORS_BUILD_LOG_DIR": str(workdir / "builds")}
        os.environ["ORS_PACKAGE_DIR"] = env["ORS_PACKAGE_DIR"]
        key = prepare_platform(env)
        t0 = time.monotonic()
        manage(["publish_env", str(PACKAGE), "--team", "builtin", "--slug", "ledger"], env, timeout=1800)
        results["publish_s"] = time.monotonic() - t0
        port = free_port()
        with server_process("platform", platform_command("uvicorn", port), env, f"http://127.0.0.1:{port}",
                            workdir / "platform.log", 120):
            url, headers = f"http://127.0.0.1:{port}/openenv/builtin/ledger", {"X-API-Key": key}
            results["spare_ready_s"] = None if args.no_spares else wait_spare(engine, image_of(engine))
            results.update(asyncio.run(_starts(url, headers, None if args.no_spares else engine)))
            with cpu_split.window(delay=args.warmup, duration=args.duration) as split:
                results["platform"] = asyncio.run(load(url, headers, args.concurrency, args.duration, args.warmup))
            results["platform_cpu"] = split
            image = image_of(engine)
            deadline = time.monotonic() + 20  # the sessions' teardowns
            while time.monotonic() < deadline and not idle_memory_mb(engine, image):
                time.sleep(0.2)
            results["idle_container_mb"] = idle_memory_mb(engine, image)
    return results


async def _starts(url: str, headers: dict[str, str], engine=None) -> dict[str, Any]:
    cold, first = await first_observation(url, headers)
    if engine is not None:  # the next spare's start is not measured into the further sessions nor the load
        await asyncio.to_thread(wait_spare, engine, image_of(engine), 2)
    warm = []
    for _ in range(5):
        seconds, client = await first_observation(url, headers)
        warm.append(seconds)
        await client.close()
    await first.close()
    return {"cold_start_s": cold, "warm_session_ms": sorted(warm)[len(warm) // 2] * 1000}


def run_builds(args: argparse.Namespace, engine, workdir: Path) -> dict[str, float]:
    from orsplatform.containers import build as image_builds

    source = Path(args.openenv_repo)
    package = workdir / "coding_env"
    archive = subprocess.run(["git", "-C", str(source), "archive", "HEAD", "envs/coding_env"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    shutil.move(str(workdir / "envs" / "coding_env"), package)
    proxy = image_builds.Proxy(hosts={"pypi.org", "files.pythonhosted.org"},
                               http_origins=frozenset({("deb.debian.org", 80), ("security.debian.org", 80)}))
    log = open(workdir / "coding_env-build.log", "a")
    times = {}
    for label, extra in (("cold", ["--no-cache"]), ("warm", [])):
        if label == "warm":  # one source file changed, as an author's next version
            with open(next(package.rglob("*.py")), "a") as f:
                f.write("\n# changed\n")
        t0 = time.monotonic()
        image_builds.build(engine=engine, context_dir=package, dockerfile=None, tag=f"ors-bench/coding:{label}",
                           proxy=proxy, log=lambda line: log.write(line + "\n"), timeout=3600, extra_args=extra)
        times[f"coding_env_build_{label}_s"] = time.monotonic() - t0
    for label in ("cold", "warm"):
        engine.run("rmi", f"ors-bench/coding:{label}", check=False)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--builds", action="store_true")
    parser.add_argument("--no-spares", action="store_true", help="no spare containers (ORS_CONTAINER_WARM_VERSIONS=0): "
                        "the first session starts its container (also for a tree that has no spares)")
    parser.add_argument("--openenv-repo", default="/work/.mirror/meta-pytorch+OpenEnv/repo")
    parser.add_argument("--load-only")
    parser.add_argument("--no-gvisor-reference", action="store_true", help="skip the image run directly by runsc")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.load_only:
        print(json.dumps(asyncio.run(load(args.load_only, {}, args.concurrency, args.duration, args.warmup))))
        return 0
    from orsplatform.containers import engine as engines

    os.environ.setdefault("ORS_CONTAINERS_DIR", str(ROOT / "var" / "containers"))
    engine = engines.acquire()
    try:
        with tempfile.TemporaryDirectory(prefix="ors-containers-bench-") as tmp:
            workdir = Path(tmp)
            results = run_platform(args, engine, workdir)
            image = image_of(engine)
            with reference(engine, image) as url:
                wait_reference(engine, url)
                with cpu_split.window(delay=args.warmup, duration=args.duration) as split:
                    results["reference"] = reference_load(engine, url, args)
                results["reference_cpu"] = split
            if not args.no_gvisor_reference:
                with reference_gvisor(engine, image, workdir) as url:
                    wait_reference(None, url, timeout=300)
                    with cpu_split.window(delay=args.warmup, duration=args.duration) as split:
                        results["reference_gvisor"] = reference_load(None, url, args)
                    results["reference_gvisor_cpu"] = split
            for side in ("reference", "reference_gvisor"):
                if side in results:
                    ratio = results["platform"]["episodes_per_s"] / max(results[side]["episodes_per_s"], 1e-9)
                    results["ratio" if side == "reference" else "ratio_gvisor"] = ratio
            if args.builds:
                results.update(run_builds(args, engine, workdir))
    finally:
        engines.release(engine)
    for side in ("reference", "reference_gvisor", "platform"):
        if side not in results:
            continue
        r = results[side]
        print(f"{side:<10} c={r['concurrency']:<3} {r['episodes_per_s']:7.1f} episodes/s  reset p50 "
              f"{r['reset_p50_ms']:.1f} ms  step p50 {r['step_p50_ms']:.1f} ms  p99 {r['step_p99_ms']:.1f} ms  "
              f"errors {r['errors']}")
        print(f"  CPU by process over the measured {args.duration:g} s:")
        print(cpu_split.report(results[f"{side}_cpu"], r["episodes"]))
    print(f"ratio platform/reference (runc) {results['ratio']:.2f}")
    if "ratio_gvisor" in results:
        print(f"ratio platform/reference under gVisor {results['ratio_gvisor']:.2f}")
    spare = ("no spare" if results["spare_ready_s"] is None else
             f"its spare, up {results['spare_ready_s']:.1f} s after the server started")
    print(f"first session of the version ({spare}) {results['cold_start_s']:.2f} s; further session on the warm container "
          f"{results['warm_session_ms']:.1f} ms (median of 5)")
    print(f"idle container memory: {', '.join(f'{m:.0f} MB' for m in results['idle_container_mb']) or 'n/a'}")
    for key in ("coding_env_build_cold_s", "coding_env_build_warm_s"):
        if key in results:
            print(f"{key}: {results[key]:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=lambda o: dict(getattr(o, "result", {}))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
