from django.urls import path

from serving import views

urlpatterns = [
    path("t/<slug:slug>/models/", views.models_page, name="serving-models"),
    path("t/<slug:slug>/models/<int:pk>/", views.model_page, name="serving-model"),
    path("t/<slug:slug>/models/<int:pk>/delete/", views.model_delete, name="serving-model-delete"),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/",
        views.version_register,
        name="serving-version-register",
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/upload/", views.version_upload, name="serving-version-upload"
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/<int:version_pk>/row/",
        views.version_row,
        name="serving-version-row",
    ),
    path(
        "t/<slug:slug>/models/<int:pk>/versions/<int:version_pk>/delete/",
        views.version_delete,
        name="serving-version-delete",
    ),
]
