from django.urls import path

from incidents import breach_views, views
from incidents.drills import views as drill_views
from incidents.notifications import views as channel_views
from incidents.rca import rule_views

urlpatterns = [
    path("t/<slug:slug>/alerts/", breach_views.breaches_page, name="alerts"),
    path("t/<slug:slug>/drills/", drill_views.drills_page, name="drills"),
    path("t/<slug:slug>/drills/new/", drill_views.drill_new, name="drill-new"),
    path("t/<slug:slug>/drills/quick/", drill_views.drill_quick, name="drill-quick"),
    path("t/<slug:slug>/drills/<int:pk>/", drill_views.drill_page, name="drill-detail"),
    path("t/<slug:slug>/drills/<int:pk>/run/", drill_views.drill_run_start, name="drill-start"),
    path("t/<slug:slug>/drill-runs/<int:pk>/", drill_views.drill_run_page, name="drill-run"),
    path(
        "t/<slug:slug>/drill-runs/<int:pk>/live/",
        drill_views.drill_run_live,
        name="drill-run-live",
    ),
    path(
        "t/<slug:slug>/drill-runs/<int:pk>/stop/",
        drill_views.drill_run_stop,
        name="drill-run-stop",
    ),
    path("t/<slug:slug>/notifications/", channel_views.channels_page, name="notification-channels"),
    path(
        "t/<slug:slug>/notifications/<int:pk>/",
        channel_views.channel_edit,
        name="notification-channel-edit",
    ),
    path(
        "t/<slug:slug>/notifications/<int:pk>/delete/",
        channel_views.channel_delete,
        name="notification-channel-delete",
    ),
    path(
        "t/<slug:slug>/notifications/<int:pk>/test/",
        channel_views.channel_test,
        name="notification-channel-test",
    ),
    path("t/<slug:slug>/cause-rules/", rule_views.cause_rules_page, name="cause-rules"),
    path(
        "t/<slug:slug>/cause-rules/matches/",
        rule_views.cause_rule_matches,
        name="cause-rule-matches",
    ),
    path("t/<slug:slug>/cause-rules/<int:pk>/", rule_views.cause_rule_edit, name="cause-rule-edit"),
    path(
        "t/<slug:slug>/cause-rules/<int:pk>/switch/",
        rule_views.cause_rule_switch,
        name="cause-rule-switch",
    ),
    path(
        "t/<slug:slug>/cause-rules/<int:pk>/delete/",
        rule_views.cause_rule_delete,
        name="cause-rule-delete",
    ),
    path("t/<slug:slug>/incidents/", views.incident_list_page, name="incident-list"),
    path("t/<slug:slug>/incidents/table/", views.incident_table, name="incident-table"),
    path(
        "t/<slug:slug>/incidents/analytics/",
        views.incident_analytics_page,
        name="incident-analytics-page",
    ),
    path("t/<slug:slug>/incidents/<int:pk>/", views.incident_page, name="incident-detail"),
    path("t/<slug:slug>/incidents/<int:pk>/row/", views.incident_row, name="incident-row"),
    path("t/<slug:slug>/incidents/<int:pk>/live/", views.incident_live, name="incident-live"),
    path("t/<slug:slug>/incidents/<int:pk>/notes/", views.incident_note, name="incident-note"),
    path(
        "t/<slug:slug>/incidents/<int:pk>/hint-feedback/",
        views.incident_hint_feedback,
        name="incident-hint-feedback",
    ),
    path(
        "t/<slug:slug>/incidents/<int:pk>/postmortem.md",
        views.incident_postmortem,
        name="incident-postmortem",
    ),
    path(
        "t/<slug:slug>/incidents/<int:pk>/<slug:action>/",
        views.incident_action,
        name="incident-action",
    ),
]
