"""Run counts that do not scan the history (issue 28, item 2).

``runtime_runcount`` holds how many runs there are per (agent, state, end cause), kept by
triggers on ``runtime_run`` in the same transaction as the write that changes a run's agent,
state or end cause (a start, a commit that ends or awaits, a fork, an import, a prune). The
gauges of /metrics and the runs list's chips read these few rows instead of counting every
run. Also an index for the chips' capped counts under an agent filter.
"""

from django.db import migrations, models

KEY = "agent, state, end_cause"

# An update takes the row locks of its two keys in one order (the smaller key first), so that
# two commits moving runs between the same two keys in opposite directions (running ->
# awaiting and awaiting -> running) wait for each other instead of deadlocking.
POSTGRESQL = f"""
CREATE FUNCTION runtime_runcount_add(a text, s text, c text, d integer) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO runtime_runcount ({KEY}, n) VALUES (a, s, coalesce(c, ''), d)
    ON CONFLICT ({KEY}) DO UPDATE SET n = runtime_runcount.n + d;
$$;
CREATE FUNCTION runtime_runcount_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM runtime_runcount_add(NEW.agent, NEW.state, NEW.end_cause, 1);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM runtime_runcount_add(OLD.agent, OLD.state, OLD.end_cause, -1);
    ELSIF (OLD.agent, OLD.state, coalesce(OLD.end_cause, ''))
            < (NEW.agent, NEW.state, coalesce(NEW.end_cause, '')) THEN
        PERFORM runtime_runcount_add(OLD.agent, OLD.state, OLD.end_cause, -1);
        PERFORM runtime_runcount_add(NEW.agent, NEW.state, NEW.end_cause, 1);
    ELSE
        PERFORM runtime_runcount_add(NEW.agent, NEW.state, NEW.end_cause, 1);
        PERFORM runtime_runcount_add(OLD.agent, OLD.state, OLD.end_cause, -1);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER runtime_runcount_insert_delete AFTER INSERT OR DELETE ON runtime_run
    FOR EACH ROW EXECUTE FUNCTION runtime_runcount_apply();
CREATE TRIGGER runtime_runcount_update AFTER UPDATE OF agent, state, end_cause ON runtime_run
    FOR EACH ROW WHEN (
        OLD.agent IS DISTINCT FROM NEW.agent OR OLD.state IS DISTINCT FROM NEW.state
        OR OLD.end_cause IS DISTINCT FROM NEW.end_cause
    ) EXECUTE FUNCTION runtime_runcount_apply();
"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS runtime_runcount_update ON runtime_run;
DROP TRIGGER IF EXISTS runtime_runcount_insert_delete ON runtime_run;
DROP FUNCTION IF EXISTS runtime_runcount_apply();
DROP FUNCTION IF EXISTS runtime_runcount_add(text, text, text, integer);
"""

_SQLITE_ADD = f"""
    INSERT INTO runtime_runcount ({KEY}, n)
    VALUES (NEW.agent, NEW.state, coalesce(NEW.end_cause, ''), 1)
    ON CONFLICT ({KEY}) DO UPDATE SET n = n + 1;"""
_SQLITE_REMOVE = """
    UPDATE runtime_runcount SET n = n - 1
    WHERE agent = OLD.agent AND state = OLD.state AND end_cause = coalesce(OLD.end_cause, '');"""

SQLITE = [
    f"CREATE TRIGGER runtime_runcount_insert AFTER INSERT ON runtime_run BEGIN{_SQLITE_ADD} END",
    f"CREATE TRIGGER runtime_runcount_delete AFTER DELETE ON runtime_run BEGIN{_SQLITE_REMOVE} END",
    "CREATE TRIGGER runtime_runcount_update AFTER UPDATE OF agent, state, end_cause "
    "ON runtime_run WHEN OLD.agent IS NOT NEW.agent OR OLD.state IS NOT NEW.state "
    f"OR OLD.end_cause IS NOT NEW.end_cause BEGIN{_SQLITE_REMOVE}{_SQLITE_ADD} END",
]
SQLITE_DROP = [
    f"DROP TRIGGER IF EXISTS runtime_runcount_{name}" for name in ("insert", "delete", "update")
]

FILL = (
    f"INSERT INTO runtime_runcount ({KEY}, n) "
    "SELECT agent, state, coalesce(end_cause, ''), count(*) FROM runtime_run "
    "GROUP BY agent, state, coalesce(end_cause, '')"
)


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRESQL)
    elif vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement)
    else:  # pragma: no cover - the runtime supports these two
        raise RuntimeError(f"run counts need triggers written for {vendor}")
    schema_editor.execute(FILL)


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_DROP)
    elif vendor == "sqlite":
        for statement in SQLITE_DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0017_history_indexes")]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["agent", "state", "end_cause"], name="run_agent_state_cause"
            ),
        ),
        migrations.CreateModel(
            name="RunCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent", models.CharField(max_length=100)),
                ("state", models.CharField(max_length=16)),
                ("end_cause", models.CharField(blank=True, default="", max_length=16)),
                ("n", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("agent", "state", "end_cause"), name="runcount_key"
                    )
                ]
            },
        ),
        migrations.RunPython(create, drop, elidable=False),
    ]
