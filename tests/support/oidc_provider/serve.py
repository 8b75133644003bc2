"""Start the test provider: make its RSA keys, migrate its sqlite database, register the
portal as a confidential client (RS256, PKCE), then serve on 127.0.0.1:<port>.

    python -m tests.support.oidc_provider.serve --port P --data-dir D --client-id C \
        --client-secret S --redirect-uri U
"""

import argparse
import os
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def _private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--port", "--data-dir", "--client-id", "--client-secret", "--redirect-uri"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.oidc_provider.settings"
    os.environ["OP_DATA_DIR"] = args.data_dir
    os.environ.setdefault("OP_SECRET_KEY", secrets.token_urlsafe(40))
    os.environ.setdefault("OP_TEST_KEY", "")
    os.environ["OP_RSA_PRIVATE_KEY"] = _private_key_pem()
    os.environ["OP_OTHER_RSA_PRIVATE_KEY"] = _private_key_pem()

    import django

    django.setup()
    from django.core.management import call_command
    from oauth2_provider.models import get_application_model

    call_command("migrate", run_syncdb=True, verbosity=0)
    application = get_application_model()
    application.objects.update_or_create(
        client_id=args.client_id,
        defaults={
            "name": "AI Ops Portal",
            "client_secret": args.client_secret,
            "client_type": application.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": args.redirect_uri,
            "algorithm": application.RS256_ALGORITHM,
        },
    )
    call_command(
        "runserver",
        f"127.0.0.1:{args.port}",
        use_reloader=False,
        use_threading=True,
        skip_checks=True,
    )


if __name__ == "__main__":
    main()
