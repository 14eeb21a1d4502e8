"""LoRA adapters: fine-tuned low-rank deltas served beside the base model."""
