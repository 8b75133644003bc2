"""OpenSLO v1 export and import of the parts of a contract that OpenSLO can state.

Ratio objectives become SLOs with a ratioMetric of metric source type `aiops-portal`; burn-rate
alerts become AlertCondition (kind burnrate) + AlertPolicy documents. OpenSLO has one window per
burnrate condition, so the long window goes to lookbackWindow, the short one to alertAfter, and
an annotation says that both must burn. Gauge objectives, fast rules and the gate do not map.

The export (and the OpenSLO vocabulary both directions share) lives in
serving.slo.openslo.export, the import and its validation in serving.slo.openslo.importer;
this package re-exports their public names.
"""

from __future__ import annotations

from serving.slo.openslo.export import (
    BOTH_WINDOWS_NOTE,
    OPENSLO_VERSION,
    PREFIX,
    SOURCE_TYPE,
    export_openslo,
)
from serving.slo.openslo.importer import import_openslo

__all__ = [
    "BOTH_WINDOWS_NOTE",
    "OPENSLO_VERSION",
    "PREFIX",
    "SOURCE_TYPE",
    "export_openslo",
    "import_openslo",
]
