"""Verified versions (issue #25.3): the replay of 1,000 recorded episodes against a new version, on
PostgreSQL, with the sandbox on. Budget: under a minute of wall time on this machine.

    cd /work/main && .venv/bin/python bench/replay_bench.py [--episodes 1000] [--calls 3] [--concurrency 32]

On a fresh PostgreSQL database (createdb here, dropped afterwards), in a child process:
1. migrate; publish version 1 of a small environment (100 tasks; tools `hint` and `submit`);
2. record --episodes ended episodes of version 1 for its team (Session and ToolCall rows as the
   gateway writes them, --calls calls each: hints then the right answer, with version 1's rewards);
3. publish version 2 (other content, the same reward logic) with the sample set to --episodes, and
   time the replay the publish queued (the embedded default runs it beside the publisher, as a
   Celery worker would): from the end of the publish to the finished report, and the replay's own
   started/finished marks. Every episode must agree (100 %).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

try:  # run as a script (bench/ on sys.path) or imported as bench.replay_bench
    from compare import manage, platform_env, postgres_database
except ImportError:  # pragma: no cover
    from bench.compare import manage, platform_env, postgres_database

ROOT = Path(__file__).resolve().parents[1]
TASKS = 100
ENV_SOURCE = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    MARK = "{mark}"


    class Answer(BaseModel):
        answer: str


    class Grader(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{{"id": i, "question": f"7 times {{i}}?", "answer": str(7 * i)}} for i in range({tasks})]

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["question"])]

        @tool
        def hint(self) -> ToolOutput:
            """A hint; no reward."""
            return ToolOutput(blocks=[TextBlock(text="multiply")], reward=0.0, finished=False)

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            """Answer; 1 when right."""
            right = params.answer == self.task_spec["answer"]
            return ToolOutput(blocks=[TextBlock(text=MARK)], reward=1.0 if right else 0.0, finished=True)
''')


def package(root: Path, mark: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "env.py").write_text(ENV_SOURCE.format(mark=mark, tasks=TASKS))
    (root / "manifest.toml").write_text('name = "grader"\nentrypoint = "env:Grader"\n')
    return root


def record(environment, version, team, episodes: int, calls: int) -> None:
    """Ended episodes as the gateway records them (bulk: the recording is not what is measured)."""
    from django.utils import timezone

    from orsplatform.episodes.models import Session, ToolCall

    now = timezone.now()
    rows = []
    for n in range(episodes):
        index = n % TASKS
        rows.append(Session(sid=f"bench-{n}", team=team, environment=environment, version=version,
                            task_spec={"id": index}, split="train", task_index=index, status="deleted",
                            created_at=now, last_activity_at=now, ended_at=now, calls=calls, total_reward=1.0,
                            finished=True))
    sessions = Session.objects.bulk_create(rows, batch_size=1000)
    hint = {"ok": True, "output": {"blocks": [{"type": "text", "text": "multiply"}], "reward": 0.0,
                                   "finished": False}}
    calls_rows = []
    for n, session in enumerate(sessions):
        index = n % TASKS
        for c in range(calls - 1):
            calls_rows.append(ToolCall(session=session, task_id=f"bench-{n}-{c}", name="hint", input={}, status="ok",
                                       output=hint, reward=0.0, started_at=now, finished_at=now))
        calls_rows.append(ToolCall(session=session, task_id=f"bench-{n}-last", name="submit",
                                   input={"answer": str(7 * index)}, status="ok", reward=1.0, finished=True,
                                   output={"ok": True, "output": {"blocks": [{"type": "text", "text": "one"}],
                                                                  "reward": 1.0, "finished": True}},
                                   started_at=now, finished_at=now))
    ToolCall.objects.bulk_create(calls_rows, batch_size=2000)


def child(episodes: int, calls: int, work: Path) -> dict:
    import django

    django.setup()
    from orsplatform.catalog.services import environment_publish
    from orsplatform.teams.services import team_create
    from orsplatform.verify.models import Verification, VerifySettings

    team = team_create(slug="bench", name="Bench")
    first = environment_publish(team=team, source_dir=package(work / "v1", "one")).version
    record(first.environment, first, team, episodes, calls)
    VerifySettings.objects.create(environment=first.environment, sample_size=episodes)
    started = time.perf_counter()
    second = environment_publish(team=team, source_dir=package(work / "v2", "two")).version
    published = time.perf_counter()
    while True:  # the replay runs beside this thread; its row says when it has finished
        verification = Verification.objects.get(version=second)
        if verification.finished:
            break
        time.sleep(0.05)  # polling interval of a benchmark's wait, not a timing
    done = time.perf_counter()
    return {"episodes": verification.report.get("episodes"), "agreement": verification.agreement,
            "status": verification.status, "calls": episodes * calls,
            "publish_s": published - started, "report_after_publish_s": done - published,
            "replay_s": (verification.finished_at - verification.started_at).total_seconds()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=3, help="tool calls per recorded episode")
    parser.add_argument("--concurrency", type=int, default=32, help="ORS_REPLAY_CONCURRENCY")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.episodes, args.calls, Path(args.child))))
        return 0
    with tempfile.TemporaryDirectory(prefix="orsreplay-") as tmp, postgres_database() as database_url:
        work = Path(tmp)
        env = {**platform_env(database_url), "ORS_VAR_DIR": str(work / "var"),
               "ORS_REPLAY_CONCURRENCY": str(args.concurrency), "ORS_REPLAY_MAX_SAMPLE": str(max(args.episodes, 1)),
               "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
               # The child imports this checkout's platform, whatever the venv has installed.
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
        # The embedded default: the replay runs beside the publisher (a Celery worker runs the same service).
        env["CELERY_TASK_ALWAYS_EAGER"] = "true"
        manage(["migrate", "--noinput"], env)
        run = subprocess.run([sys.executable, __file__, "--child", str(work), "--episodes", str(args.episodes),
                              "--calls", str(args.calls)], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=1800)
        if run.returncode != 0:
            print(run.stdout[-3000:], run.stderr[-5000:], file=sys.stderr)
            return 1
        result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"== replay of {result['episodes']} episodes ({result['calls']} calls) at concurrency {args.concurrency}: "
          f"{result['replay_s']:.1f} s ({result['episodes'] / result['replay_s']:.0f} episodes/s); report "
          f"{result['report_after_publish_s']:.1f} s after the publish returned (publish {result['publish_s']:.1f} s); "
          f"agreement {result['agreement']:.0%}, status {result['status']}")
    ok = (result["episodes"] == args.episodes and result["agreement"] == 1.0
          and result["report_after_publish_s"] < 60)
    print(f"budget (1,000 episodes replayed in under a minute, all agreeing): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
