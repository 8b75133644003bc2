"""Tenancy: tenants, memberships, API tokens, quotas, audit; the scoping base other apps use."""
