"""Model registry API: short declarations on the scoped base; rules live in services/selectors."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, status
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.validation import validated
from serving.registry import artifacts, selectors, services
from serving.registry.api import filters
from serving.registry.api import serializers as s
from serving.registry.models import Model, ModelVersion
from serving.registry.services.golden import version_golden_request, version_golden_throttle
from tenants.api.base import RateLimited, TenantScopedViewSet
from tenants.models import Tenant


class ArchiveParser(BaseParser):
    """Declares the archive media types and parses to nothing without reading: DRF's CSRF
    check touches `request.POST` on session POSTs, which would otherwise read the whole body.
    The upload view streams the body itself."""

    media_type = "*/*"  # the view checks the content type itself, with a clear 415

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return {}


class ModelViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Models of your tenant. POST creates, PATCH changes the description, DELETE removes the
    model with all its versions."""

    queryset = Model.objects.none()
    serializer_class = s.RegistryModelSerializer
    filterset_class = filters.ModelFilter

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.model_list(tenant=tenant)

    def _out(self, model: Model) -> Response:
        model = selectors.model_list(tenant=self.ctx.tenant).get(pk=model.pk)
        return Response(s.RegistryModelSerializer(model).data)

    @extend_schema(request=s.ModelCreateSerializer, responses={201: s.RegistryModelSerializer})
    def create(self, request: Request) -> Response:
        data = validated(s.ModelCreateSerializer, request.data)
        model = services.model_create(tenant=self.ctx.tenant, actor=self.ctx.actor, **data)
        response = self._out(model)
        response.status_code = status.HTTP_201_CREATED
        return response

    @extend_schema(request=s.ModelUpdateSerializer, responses=s.RegistryModelSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        model = self.get_object()
        data = validated(s.ModelUpdateSerializer, request.data)
        model = services.model_update(
            tenant=self.ctx.tenant, actor=self.ctx.actor, model=model, **data
        )
        return self._out(model)

    def destroy(self, request: Request, pk: str) -> Response:
        services.model_delete(tenant=self.ctx.tenant, actor=self.ctx.actor, model=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


_UPLOAD_PARAMS = [
    OpenApiParameter("label", str, required=True, description="The new version's label."),
    OpenApiParameter("sha256", str, description="Expected directory checksum (optional)."),
    OpenApiParameter(
        "engines", str, description="Engines to validate it for, comma-separated (builtin, vllm)."
    ),
]


class ModelVersionViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    TenantScopedViewSet,
):
    """Versions of one model. POST `{label, path, sha256?}` registers a local directory;
    POST/PUT `upload/?label=` takes a tar or tar.gz as the raw body. Validation runs in the
    background: poll the version until `status` is `ready` or `failed`."""

    queryset = ModelVersion.objects.none()
    serializer_class = s.ModelVersionSerializer
    filterset_class = filters.ModelVersionFilter
    # URL kwarg -> attribute of a version holding the parent's id (the route matrices use it).
    parent_lookups: ClassVar[dict[str, str]] = {"model_pk": "model_id"}
    parent: Model

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # The parent is resolved inside the caller's tenant: a foreign model is a 404.
        self.parent = selectors.model_get(tenant=self.ctx.tenant, pk=self.kwargs["model_pk"])

    def scoped_queryset(self, tenant: Tenant) -> Any:
        return selectors.version_list(tenant=tenant, model=self.parent)

    @extend_schema(request=s.VersionRegisterSerializer, responses={201: s.ModelVersionSerializer})
    def create(self, request: Request, model_pk: str) -> Response:
        data = validated(s.VersionRegisterSerializer, request.data)
        version = services.version_register_path(
            tenant=self.ctx.tenant, actor=self.ctx.actor, model=self.parent, **data
        )
        return Response(s.ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request={
            "application/x-tar": OpenApiTypes.BINARY,
            "application/gzip": OpenApiTypes.BINARY,
        },
        parameters=_UPLOAD_PARAMS,
        responses={201: s.ModelVersionSerializer},
    )
    @action(
        detail=False,
        methods=["post", "put"],
        url_path="upload",
        parser_classes=[ArchiveParser],
    )
    def upload(self, request: Request, model_pk: str) -> Response:
        params = validated(s.VersionUploadQuerySerializer, request.query_params)
        content_type = (request.content_type or "").split(";")[0].strip().lower()
        if content_type not in artifacts.UPLOAD_CONTENT_TYPES:
            raise exceptions.UnsupportedMediaType(
                content_type or "none",
                detail=(
                    f"Send the archive as the raw body with Content-Type application/x-tar or "
                    f"application/gzip (got {content_type or 'none'!r})."
                ),
            )
        version = services.version_register_upload(
            tenant=self.ctx.tenant,
            actor=self.ctx.actor,
            model=self.parent,
            label=params["label"],
            sha256=params.get("sha256"),
            engines=params.get("engines"),
            # The Django request itself: read in chunks, never parsed or held in memory.
            stream=request._request,
            content_length=_content_length(request),
        )
        return Response(s.ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.GoldenPromptsSerializer, responses={202: s.ModelVersionSerializer})
    @action(detail=True, methods=["put"])
    def golden(self, request: Request, model_pk: str, pk: str) -> Response:
        """Add up to 4 golden prompts of your own (202): the version's greedy answers to them
        and the defaults are recorded from its checkpoint; the consistency probe replays them."""
        version = self.get_object()
        data = validated(s.GoldenPromptsSerializer, request.data)
        if (wait := version_golden_throttle(tenant=self.ctx.tenant)) > 0:
            raise RateLimited(wait=wait)
        version = version_golden_request(
            tenant=self.ctx.tenant, actor=self.ctx.actor, version=version, prompts=data["prompts"]
        )
        return Response(s.ModelVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)

    def destroy(self, request: Request, model_pk: str, pk: str) -> Response:
        services.version_delete(
            tenant=self.ctx.tenant, actor=self.ctx.actor, version=self.get_object()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


def _content_length(request: Request) -> int | None:
    raw = request.META.get("CONTENT_LENGTH")
    try:
        return int(raw) if raw else None
    except ValueError:
        raise exceptions.ParseError("Content-Length is not a number.") from None
