"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit in OIDC
mode as its own small Django project (sqlite in a temp dir, an RSA key made at start), run as
a subprocess by `harness.start_provider` (`python -m tests.support.oidc_provider.serve`)."""
