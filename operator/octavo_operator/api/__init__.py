"""The `InferenceService` API: its CRD and its parsed spec."""
