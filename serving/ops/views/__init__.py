"""The ops pages: contract, health, rollouts."""
