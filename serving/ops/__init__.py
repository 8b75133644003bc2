"""The ops loop: SLA contracts, SLI store, health tick, rollouts and rollbacks."""
