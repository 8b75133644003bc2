"""Test hooks of the provider (loopback only, behind OP_TEST_KEY): set a user's password,
e-mail and groups; serve a JWKS whose key has the real key's id but is another key."""

import json
import os

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from jwcrypto import jwk
from oauth2_provider.models import get_application_model

from tests.support.oidc_provider.models import ClaimSet


@csrf_exempt
def set_user(request: HttpRequest) -> HttpResponse:
    if request.headers.get("X-Test-Key") != os.environ["OP_TEST_KEY"]:
        return HttpResponse(status=403)
    data = json.loads(request.body)
    user, _ = User.objects.get_or_create(username=data["username"])
    user.email = data["email"]
    user.first_name = data.get("given_name", "")
    user.last_name = data.get("family_name", "")
    user.set_password(data["password"])
    user.save()
    ClaimSet.objects.update_or_create(
        user=user,
        defaults={"email_verified": data.get("email_verified", True), "groups": data["groups"]},
    )
    return JsonResponse({"sub": str(user.pk)})


def other_jwks(request: HttpRequest) -> HttpResponse:
    """A key the provider does not sign with, published under the id of the one it does."""
    real = get_application_model().objects.get().jwk_key
    other = jwk.JWK.from_pem(os.environ["OP_OTHER_RSA_PRIVATE_KEY"].encode())
    public = other.export_public(as_dict=True)
    public.update({"kid": real.thumbprint(), "alg": "RS256", "use": "sig"})
    return JsonResponse({"keys": [public]})
