from django.urls import path

from incidents import views

urlpatterns = [
    path("t/<slug:slug>/incidents/", views.incident_list_page, name="incident-list"),
    path("t/<slug:slug>/incidents/table/", views.incident_table, name="incident-table"),
    path("t/<slug:slug>/incidents/<int:pk>/", views.incident_page, name="incident-detail"),
    path("t/<slug:slug>/incidents/<int:pk>/row/", views.incident_row, name="incident-row"),
    path("t/<slug:slug>/incidents/<int:pk>/live/", views.incident_live, name="incident-live"),
    path("t/<slug:slug>/incidents/<int:pk>/notes/", views.incident_note, name="incident-note"),
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
