"""A partial index of the stored SLI rows that may start an episode (a row's cumulative requests
equal to its own: the slot's totals counted from 0 again, or a slot with no traffic before it),
and of rows without cumulative totals: a window with none of them between its first and its
newest row is one episode, so its sum is one subtraction (serving.ops.selectors.
window_request_totals). Built CONCURRENTLY: the health tick inserts rows into this table every
tick, and a plain CREATE INDEX would hold its writes for the whole build."""

from django.db import migrations

CREATE = (
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS sli_episode_start ON serving_slisample (deployment_id, "group",'
    ' resolution, "end") WHERE NOT (cumulative ? \'requests\' AND cumulative ? \'errors\')'
    " OR cumulative -> 'requests' = requests::text::jsonb"
)


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY runs outside a transaction
    dependencies = [("serving", "0015_sticky_traffic")]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS sli_episode_start"),
    ]
