"""The Octavo operator: reconciles `InferenceService` resources (octavo.dev/v1alpha1).

Layout, in the order a reconcile reads it:
- `api/`: the CRD (schema, CEL rules, printer columns) and the spec parsed into dataclasses;
- `builders/`: pure functions from a parsed spec to each child object;
- `reconcile.py`: applies the children (server-side apply) and removes the ones turned off;
- `status.py`: the status and conditions computed from the children;
- `handlers.py`: the kopf handlers that tie these together; `main.py`: the command.
"""
