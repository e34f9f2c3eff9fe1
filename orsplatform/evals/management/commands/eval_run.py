"""Launch (or resume, or watch) an evaluation run from a shell, with a progress bar.

    manage.py eval_run --team acme --agent solver --environment builtin/math --split test --stop 100
    manage.py eval_run --team acme --resume 12
    manage.py eval_run --team acme --watch 12

Without a broker (the embedded default) the run is driven inside this process, so the command waits
for it; with one, a Celery worker drives it and the command only watches (Ctrl-C leaves it running).
"""

from __future__ import annotations

import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orsplatform.evals import selectors, services
from orsplatform.evals.models import EvalRun
from orsplatform.teams.models import Team

BAR_WIDTH = 30


class Command(BaseCommand):
    help = "Run an AAP agent on an environment's tasks (or resume / watch a run), showing progress."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True, help="team slug")
        parser.add_argument("--agent", help="the team's agent, by name or id")
        parser.add_argument("--environment", help="team/slug[@N]")
        parser.add_argument("--split", default="test")
        parser.add_argument("--start", type=int, default=0)
        parser.add_argument("--stop", type=int)
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--max-turns", type=int, default=20)
        parser.add_argument("--turn-timeout", type=float)
        parser.add_argument("--secret", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--resume", type=int, metavar="RUN_ID", help="run again the unscored episodes of a run")
        parser.add_argument("--watch", type=int, metavar="RUN_ID", help="only show a run's progress")
        parser.add_argument("--no-wait", action="store_true", help="enqueue and return (needs a broker)")

    def handle(self, *args, **opts) -> None:
        team = Team.objects.filter(slug=opts["team"]).first()
        if team is None:
            raise CommandError(f"No team {opts['team']!r}.")
        try:
            run = self._start(team, opts)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        self.stdout.write(f"Run #{run.id}: {run.total} episodes of {opts.get('environment') or 'the run'} "
                          f"({run.split} [{run.start}, {run.stop}))")
        if opts["no_wait"]:
            return
        self._watch(team, run.id)

    def _start(self, team: Team, opts: dict) -> EvalRun:
        if opts["watch"] or opts["resume"]:
            run = selectors.run_of_team(team=team, run_id=opts["watch"] or opts["resume"])
            if run is None:
                raise CommandError("No such run in this team.")
            if not opts["resume"]:
                return run
            return services.eval_run_resume(run=run, secrets=_secrets(opts))
        if not (opts["agent"] and opts["environment"]):
            raise CommandError("--agent and --environment are required to launch a run.")
        agent = selectors.agent_by_name(team=team, name=opts["agent"])
        if agent is None:
            raise CommandError(f"No agent {opts['agent']!r} in team {team.slug}.")
        return services.eval_run_launch(
            team=team, agent=agent, environment=opts["environment"], split=opts["split"], start=opts["start"],
            stop=opts["stop"], concurrency=opts["concurrency"], max_turns=opts["max_turns"],
            turn_timeout=opts["turn_timeout"], secrets=_secrets(opts))

    def _watch(self, team: Team, run_id: int) -> None:
        started = time.monotonic()
        while True:
            run = selectors.run_of_team(team=team, run_id=run_id)
            n = selectors.run_numbers(run=run)
            filled = int(BAR_WIDTH * n["done"] / max(1, n["total"]))
            rate = n["done"] / max(1e-9, time.monotonic() - started)
            line = (f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {n['done']}/{n['total']} "
                    f"passed {n['passed']} errors {n['errors']} · {rate:.1f} ep/s · {run.status}   ")
            self.stdout.write(line, ending="")
            self.stdout.flush()
            if not run.is_active:
                break
            time.sleep(0.5)  # the bar's refresh interval
        self.stdout.write("")
        if n["pass_rate"] is not None:
            lo, hi = n["pass_rate_interval"]
            self.stdout.write(f"pass rate {n['pass_rate']:.3f} [{lo:.3f}, {hi:.3f}] · mean reward "
                              f"{n['mean_reward']:.3f} · status {run.status}{': ' + run.error if run.error else ''}")


def _secrets(opts: dict) -> dict[str, str] | None:
    """--secret NAME=VALUE options (a resume needs them again: the platform does not keep them)."""
    return dict(s.split("=", 1) for s in opts["secret"] if "=" in s) or None
