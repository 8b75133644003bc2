"""The model registry: models, versions, artifacts and their validation."""
