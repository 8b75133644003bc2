"""What the tenants room tells the rooms built on it (they subscribe in their AppConfig.ready).

`tenant_suspension_changed` is sent after the commit that suspends or reinstates a tenant:
serving reconciles (routers refuse a suspended tenant's traffic), the drills see it at their
next step, notifications read the tenant's row before sending.
"""

from __future__ import annotations

from django.dispatch import Signal

tenant_suspension_changed = Signal()  # kwargs: tenant (Tenant), suspended (bool)
