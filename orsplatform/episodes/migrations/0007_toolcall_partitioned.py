"""The audit log partitioned by day on PostgreSQL (docs/audit-log.md); one plain table on SQLite.

The model's state changes the same way on both: task_id is unique together with started_at (a
partitioned table's unique keys must hold its partition key). On SQLite that is the whole change.
On PostgreSQL the table is replaced, under a lock held only for the renames and the CREATEs (no
row is copied here): the old table becomes episodes_toolcall_legacy, with its rows, and a new
episodes_toolcall PARTITION BY RANGE (started_at) takes its name, with a default partition and the
partitions of yesterday to a week ahead. An empty legacy table (a new installation) is dropped; a
full one is moved into the partitions by `manage.py audit_partitions migrate-legacy`, in short
batches, resumable (docs/audit-log.md).
"""

from datetime import UTC, datetime, timedelta

from django.db import migrations, models

AHEAD_DAYS = 7


class OnlyOn(migrations.operations.base.Operation):
    """`operation` on the database only for a vendor other than PostgreSQL (its state always)."""

    reduces_to_sql = False

    def __init__(self, operation):
        self.operation = operation

    def state_forwards(self, app_label, state):
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            self.operation.database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self):
        return f"{self.operation.describe()} (not on PostgreSQL)"

    def deconstruct(self):
        return self.__class__.__name__, [self.operation], {}


def partition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as c:
        c.execute("LOCK TABLE episodes_toolcall IN ACCESS EXCLUSIVE MODE")
        c.execute("SELECT EXISTS(SELECT 1 FROM episodes_toolcall), COALESCE(MAX(id), 0) FROM episodes_toolcall")
        has_rows, top = c.fetchone()
        c.execute("ALTER TABLE episodes_toolcall RENAME TO episodes_toolcall_legacy")
        # Its indexes keep their names, which the new table's would collide with.
        c.execute("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                  " WHERE i.indrelid = 'episodes_toolcall_legacy'::regclass")
        for (name,) in c.fetchall():
            c.execute(f'ALTER INDEX "{name}" RENAME TO "{name[:50]}_legacy"')
        # Frees the sequence's name (an identity's, or a plain one's after a rollback of this
        # migration); the legacy table takes no new rows.
        c.execute("ALTER TABLE episodes_toolcall_legacy ALTER COLUMN id DROP IDENTITY IF EXISTS")
        c.execute("ALTER TABLE episodes_toolcall_legacy ALTER COLUMN id DROP DEFAULT")
        c.execute("DROP SEQUENCE IF EXISTS episodes_toolcall_id_seq")
        c.execute("CREATE TABLE episodes_toolcall (LIKE episodes_toolcall_legacy INCLUDING DEFAULTS)"
                  " PARTITION BY RANGE (started_at)")
        c.execute(f"CREATE SEQUENCE episodes_toolcall_id_seq START {top + 1} OWNED BY episodes_toolcall.id")
        c.execute("ALTER TABLE episodes_toolcall ALTER COLUMN id SET DEFAULT nextval('episodes_toolcall_id_seq')")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT episodes_toolcall_pkey PRIMARY KEY (id, started_at)")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT toolcall_task_started_unique"
                  " UNIQUE (task_id, started_at)")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT episodes_toolcall_session_id_fk_episodes_session_id"
                  " FOREIGN KEY (session_id) REFERENCES episodes_session (id) DEFERRABLE INITIALLY DEFERRED")
        c.execute("CREATE INDEX episodes_to_session_e19e9f_idx ON episodes_toolcall (session_id, started_at)")
        c.execute("CREATE TABLE episodes_toolcall_default PARTITION OF episodes_toolcall DEFAULT")
        today = datetime.now(UTC).date()
        for offset in range(-1, AHEAD_DAYS + 1):
            day = today + timedelta(days=offset)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            c.execute(f"CREATE TABLE episodes_toolcall_p{day:%Y%m%d} PARTITION OF episodes_toolcall"
                      " FOR VALUES FROM (%s) TO (%s)", [start, start + timedelta(days=1)])
        if not has_rows:
            c.execute("DROP TABLE episodes_toolcall_legacy")


def unpartition(apps, schema_editor):
    """Back to one table (the rows copied: a rollback of a fresh or small installation)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as c:
        c.execute("CREATE TABLE episodes_toolcall_plain (LIKE episodes_toolcall INCLUDING DEFAULTS)")
        c.execute("INSERT INTO episodes_toolcall_plain SELECT * FROM episodes_toolcall")
        c.execute("INSERT INTO episodes_toolcall_plain SELECT * FROM episodes_toolcall_legacy"
                  if _exists(c, "episodes_toolcall_legacy") else "SELECT 1")
        # The sequence goes with the table that owns it: it is handed over first.
        c.execute("ALTER SEQUENCE episodes_toolcall_id_seq OWNED BY episodes_toolcall_plain.id")
        c.execute("DROP TABLE episodes_toolcall")
        c.execute("DROP TABLE IF EXISTS episodes_toolcall_legacy")
        c.execute("ALTER TABLE episodes_toolcall_plain RENAME TO episodes_toolcall")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT episodes_toolcall_pkey PRIMARY KEY (id)")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT episodes_toolcall_task_id_key UNIQUE (task_id)")
        c.execute("CREATE INDEX episodes_toolcall_task_id_like ON episodes_toolcall (task_id varchar_pattern_ops)")
        c.execute("ALTER TABLE episodes_toolcall ADD CONSTRAINT episodes_toolcall_session_id_fk_episodes_session_id"
                  " FOREIGN KEY (session_id) REFERENCES episodes_session (id) DEFERRABLE INITIALLY DEFERRED")
        c.execute("CREATE INDEX episodes_to_session_e19e9f_idx ON episodes_toolcall (session_id, started_at)")


def _exists(cursor, table: str) -> bool:
    cursor.execute("SELECT to_regclass(%s)", [table])
    return cursor.fetchone()[0] is not None


class Migration(migrations.Migration):

    # The LOCK and the renames in one transaction with the CREATEs: writers wait for that moment only.
    atomic = True

    dependencies = [
        ('episodes', '0006_toolcall_session_no_own_index'),
    ]

    operations = [
        OnlyOn(migrations.AlterField(
            model_name='toolcall',
            name='task_id',
            field=models.CharField(max_length=64),
        )),
        OnlyOn(migrations.AddConstraint(
            model_name='toolcall',
            constraint=models.UniqueConstraint(fields=('task_id', 'started_at'), name='toolcall_task_started_unique'),
        )),
        migrations.RunPython(partition, unpartition),
    ]
