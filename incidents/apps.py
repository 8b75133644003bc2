from django.apps import AppConfig

# Several incidents models have `status`, `kind` and severity choices: name each OpenAPI enum
# after its model (as portal/settings.py does for serving). Registered here because the
# settings file belongs to the platform; an entry there of the same name wins.
ENUM_NAMES = {
    "IncidentStatusEnum": "incidents.models.IncidentStatus",
    "SeverityEnum": "incidents.models.Severity",
    "EventKindEnum": "incidents.models.EventKind",
    "BreachKindEnum": "incidents.models.BreachKind",
    "BreachGroupEnum": "incidents.models.BreachGroup",
    "BreachActionEnum": "incidents.models.BreachAction",
    "ChannelKindEnum": "incidents.models.ChannelKind",
    "RuleOpEnum": "incidents.models.RuleOp",
    "RollbackStatusEnum": "serving.ops_models.RollbackStatus",
}


class IncidentsConfig(AppConfig):
    name = "incidents"

    def ready(self) -> None:
        from django.conf import settings

        spectacular = getattr(settings, "SPECTACULAR_SETTINGS", None)
        if isinstance(spectacular, dict):
            overrides = spectacular.setdefault("ENUM_NAME_OVERRIDES", {})
            for name, choices in ENUM_NAMES.items():
                overrides.setdefault(name, choices)
