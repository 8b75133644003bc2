"""The health chart's buckets summed in the database: per slot and bucket of `bucket` seconds
(by each row's end), the rows' spans, requests, errors, rejected and latency histogram,
element-wise, in one grouped query instead of reading every row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from serving.slo.counts import HISTOGRAM_SIZE

_FULL = "(jsonb_typeof(latency) = 'array' AND jsonb_array_length(latency) = %(size)s)"
_EMPTY = "(jsonb_typeof(latency) = 'array' AND jsonb_array_length(latency) = 0)"
_SQL = (
    'SELECT "group", floor(extract(epoch FROM "end"))::bigint / %(bucket)s * %(bucket)s,'  # noqa: S608
    ' SUM(extract(epoch FROM "end" - start)), SUM(requests), SUM(errors), SUM(rejected),'
    f" COUNT(*) FILTER (WHERE {_FULL}), BOOL_AND({_FULL} OR {_EMPTY}),"
    ' BOOL_AND(extract(epoch FROM "end" - start) = floor(extract(epoch FROM "end" - start))), '
    + ", ".join(
        f"SUM(CASE WHEN {_FULL} THEN (latency ->> {i})::bigint ELSE 0 END)"
        for i in range(HISTOGRAM_SIZE)
    )
    + " FROM serving_slisample WHERE tenant_id = %(tenant)s AND deployment_id = %(deployment)s"
    ' AND resolution = %(resolution)s AND "end" >= %(since)s GROUP BY 1, 2'
)


def bucket_sums(
    *, tenant_id: int, deployment_id: int, resolution: int, since: datetime, bucket: int
) -> dict[str, dict[int, list[Any]]] | None:
    """{group: {bucket start: [seconds, requests, errors, rejected, latency]}} of the rows
    ending at or after `since`, as adding the rows one by one in time order gives them (the
    histogram: [] where no row has one). None where that sum could differ (a histogram that is
    neither empty nor full, or spans of a fraction of a second, whose float sum depends on the
    order): the caller then adds the rows itself."""
    params: dict[str, Any] = {
        "size": HISTOGRAM_SIZE,
        "bucket": bucket,
        "tenant": tenant_id,
        "deployment": deployment_id,
        "resolution": resolution,
        "since": since,
    }
    sums: dict[str, dict[int, list[Any]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_SQL, params)
        for group, key, seconds, requests, errors, rejected, full, plain, whole, *hist in cursor:
            if not plain or not whole:
                return None
            latency = [int(v) for v in hist] if full else []
            sums.setdefault(group, {})[int(key)] = [
                float(seconds),
                int(requests),
                int(errors),
                int(rejected),
                latency,
            ]
    return sums
