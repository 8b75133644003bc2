"""All writes of the tenants room, one module per capability: audit (the trail every service
appends to), onboarding (tenants, signup and its verification, suspension), members (roles,
removal and the offboarding they carry out), invitations, tokens (API tokens), quotas and sso
(the accounts and memberships single sign-on grants).
This package re-exports their public names, so `tenants.services.<name>` keeps working."""

from __future__ import annotations

from portal.exceptions import ConflictError as ConflictError
from portal.exceptions import PermissionDeniedError as PermissionDeniedError
from portal.exceptions import ValidationFailed as ValidationFailed
from tenants.links import SIGNUP_VERIFY_SALT
from tenants.secrets import INVITATION_PREFIX, TOKEN_PREFIX
from tenants.services.audit import audit_record
from tenants.services.invitations import (
    invitation_accept,
    invitation_create,
    invitation_revoke,
    invitations_expire,
)
from tenants.services.members import (
    MEMBER_REMOVED_EVENT,
    membership_remove,
    membership_set_role,
)
from tenants.services.onboarding import (
    SIGNUP_MODES,
    max_tenants_per_user,
    signup,
    signup_mode,
    signup_verify,
    signup_verify_ttl_hours,
    tenant_create,
    tenant_set_suspended,
    tenant_update,
)
from tenants.services.quotas import PLAN_QUOTAS, QUOTA_FIELDS, quota_update
from tenants.services.sso import oidc_memberships_sync, oidc_user_sign_in
from tenants.services.tokens import (
    TOKEN_RATE_LIMIT_MAX,
    api_token_create,
    api_token_revoke,
    api_token_touch,
)
from tenants.throttles import login_throttle, signup_throttle

__all__ = [
    "INVITATION_PREFIX",
    "MEMBER_REMOVED_EVENT",
    "PLAN_QUOTAS",
    "QUOTA_FIELDS",
    "SIGNUP_MODES",
    "SIGNUP_VERIFY_SALT",
    "TOKEN_PREFIX",
    "TOKEN_RATE_LIMIT_MAX",
    "api_token_create",
    "api_token_revoke",
    "api_token_touch",
    "audit_record",
    "invitation_accept",
    "invitation_create",
    "invitation_revoke",
    "invitations_expire",
    "login_throttle",
    "max_tenants_per_user",
    "membership_remove",
    "membership_set_role",
    "oidc_memberships_sync",
    "oidc_user_sign_in",
    "quota_update",
    "signup",
    "signup_mode",
    "signup_throttle",
    "signup_verify",
    "signup_verify_ttl_hours",
    "tenant_create",
    "tenant_set_suspended",
    "tenant_update",
]
