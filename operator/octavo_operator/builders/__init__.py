"""Pure builders: one child object per module, from a parsed `InferenceService`."""
