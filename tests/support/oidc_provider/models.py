"""What the test provider says about each user beyond Django's own fields."""

from django.conf import settings
from django.db import models


class ClaimSet(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    email_verified = models.BooleanField(default=True)
    groups = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"claims of {self.user_id}"
