"""A small audit log with hand-computable numbers, written straight through the ORM.

acme/puzzle (private to acme), version 1, split "train": ten ended sessions with total rewards
    0, 0, 0, 0.25, 0.5, 0.5, 1, 1, 1, 1            (task_index = i % 5)
and episode lengths 5, 5, 8, 8, 10, 10, 12, 12, 15, 15 calls (100 calls). Call k (0..99, in order)
takes k + 1 ms; every tenth call (k = 9, 19, …) is an error; the last call of each session is
"submit", the others "move". Version 2, split "test": two ended sessions with rewards 1 and 0, one
call of 200 ms each. builtin/math: one open (ready) acme session with two calls so far (reward 1
then 0.5). globex has one ended session of its own on builtin/math.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import ApiKey, Team

REWARDS = [0.0, 0.0, 0.0, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
LENGTHS = [5, 5, 8, 8, 10, 10, 12, 12, 15, 15]


def _png(size: int = 48, rgb: tuple[int, int, int] = (36, 84, 214)) -> str:
    """A base64 PNG of a solid square, like the vision environment's prompts."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


PNG_SQUARE = _png()


@dataclass
class Seeded:
    now: datetime
    puzzle: Environment
    v1: EnvironmentVersion
    v2: EnvironmentVersion
    math: Environment
    sessions: list[Session] = field(default_factory=list)
    test_sessions: list[Session] = field(default_factory=list)
    open_session: Session | None = None
    globex_session: Session | None = None


def make_environment(team: Team, slug: str, versions: int = 2, visibility: str = "private") -> tuple[Environment, list]:
    env = Environment.objects.create(team=team, slug=slug, visibility=visibility, description=f"{slug} for tests")
    made = [EnvironmentVersion.objects.create(environment=env, number=n, content_hash=f"{slug}-{n}".ljust(64, "0"),
                                              package_path="", entrypoint="env:Env", status="ready")
            for n in range(1, versions + 1)]
    env.current_version = made[-1]
    env.save(update_fields=["current_version"])
    return env, made


def _session(*, sid: str, team: Team, key: ApiKey | None, version: EnvironmentVersion, created_at: datetime,
             split: str, index: int | None, status: str = "deleted", reward: float | None = None, calls: int = 0,
             finished: bool = False, prompt=None) -> Session:
    ended = status in ("deleted", "expired", "lost")
    return Session.objects.create(
        sid=sid, team=team, api_key=key, environment=version.environment, version=version,
        task_spec={"question": f"task {index} of {split}", "answer": "secret-answer-not-a-secret"},
        split=split, task_index=index, status=status, created_at=created_at, ready_at=created_at,
        last_activity_at=created_at + timedelta(minutes=1), ended_at=created_at + timedelta(minutes=1) if ended else None,
        calls=calls if ended else 0, total_reward=reward if ended else None, finished=finished if ended else False,
        prompt=prompt,
    )


def _call(session: Session, *, n: int, name: str, started_at: datetime, ms: float, error: bool = False,
          reward: float | None = None, finished: bool = False) -> ToolCall:
    if error:
        output = {"ok": False, "error": "Invalid move", "reason": "tool_error"}
    else:
        output = {"ok": True, "output": {"blocks": [{"type": "text", "text": f"result {n}"}], "metadata": None,
                                         "reward": reward, "finished": finished}}
    return ToolCall(
        session=session, task_id=f"{session.sid}-{n}", name=name, input={"step": n}, status="error" if error else "ok",
        output=output, reward=None if error else reward, finished=finished and not error,
        error="Invalid move" if error else "", started_at=started_at,
        finished_at=started_at + timedelta(milliseconds=ms),
    )


def seed(*, acme: Team, globex: Team | None = None, now: datetime | None = None) -> Seeded:
    now = now or timezone.now()
    key = ApiKey.objects.filter(team=acme).order_by("created_at").first()
    puzzle, (v1, v2) = make_environment(acme, "puzzle")
    math_env = Environment.objects.get(team__slug="builtin", slug="math")
    out = Seeded(now=now, puzzle=puzzle, v1=v1, v2=v2, math=math_env)
    base = now - timedelta(hours=20)
    calls: list[ToolCall] = []
    k = 0
    for i, (reward, length) in enumerate(zip(REWARDS, LENGTHS, strict=True)):
        created = base + timedelta(minutes=10 * i)
        prompt = [{"type": "text", "text": f"Solve puzzle {i % 5}"}, {"type": "image", "mimeType": "image/png",
                                                                      "data": PNG_SQUARE}] if i == 0 else None
        s = _session(sid=f"acme-puzzle-{i}", team=acme, key=key, version=v1, created_at=created, split="train",
                     index=i % 5, reward=reward, calls=length, finished=True, prompt=prompt)
        out.sessions.append(s)
        for n in range(length):
            last = n == length - 1
            calls.append(_call(s, n=n, name="submit" if last else "move", started_at=created + timedelta(seconds=n),
                               ms=k + 1, error=(k % 10 == 9), reward=reward if last else 0.0, finished=last))
            k += 1
    for j, reward in enumerate([1.0, 0.0]):
        created = base + timedelta(hours=2, minutes=j)
        s = _session(sid=f"acme-test-{j}", team=acme, key=key, version=v2, created_at=created, split="test", index=j,
                     reward=reward, calls=1, finished=True)
        out.test_sessions.append(s)
        calls.append(_call(s, n=0, name="submit", started_at=created, ms=200, reward=reward, finished=True))
    opened = _session(sid="acme-open-0", team=acme, key=key, version=math_env.current_version,
                      created_at=now - timedelta(minutes=5), split="train", index=3, status="ready")
    out.open_session = opened
    calls.append(_call(opened, n=0, name="submit", started_at=now - timedelta(minutes=4), ms=30, reward=1.0))
    calls.append(_call(opened, n=1, name="submit", started_at=now - timedelta(minutes=3), ms=40, reward=0.5))
    if globex is not None:
        gkey = ApiKey.objects.filter(team=globex).order_by("created_at").first()
        g = _session(sid="globex-private-0", team=globex, key=gkey, version=math_env.current_version,
                     created_at=base, split="train", index=1, reward=1.0, calls=1, finished=True)
        out.globex_session = g
        calls.append(_call(g, n=0, name="submit", started_at=base, ms=7, reward=1.0, finished=True))
    ToolCall.objects.bulk_create(calls)
    return out
