"""Pages of the registry room, under /t/<slug>/ (see serving/urls.py)."""

from django.urls import path

from serving.registry import views

urlpatterns = [
    path("models/", views.models_page, name="serving-models"),
    path("models/<int:pk>/", views.model_page, name="serving-model"),
    path("models/<int:pk>/delete/", views.model_delete, name="serving-model-delete"),
    path(
        "models/<int:pk>/versions/",
        views.version_register,
        name="serving-version-register",
    ),
    path("models/<int:pk>/upload/", views.version_upload, name="serving-version-upload"),
    path(
        "models/<int:pk>/versions/<int:version_pk>/row/",
        views.version_row,
        name="serving-version-row",
    ),
    path(
        "models/<int:pk>/versions/<int:version_pk>/delete/",
        views.version_delete,
        name="serving-version-delete",
    ),
]
