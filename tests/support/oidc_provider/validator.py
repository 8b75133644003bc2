"""The provider's claims: e-mail (verified or not), names and `groups`, in the ID token and
from the userinfo endpoint (the `groups` scope releases the groups)."""

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator

from tests.support.oidc_provider.models import ClaimSet


class GroupsValidator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        claims = ClaimSet.objects.filter(user=user).first()
        return {
            "email": user.email,
            "email_verified": claims.email_verified if claims else True,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": list(claims.groups) if claims else [],
        }
