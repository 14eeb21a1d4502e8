"""The Octavo Kubernetes operator (kopf)."""
