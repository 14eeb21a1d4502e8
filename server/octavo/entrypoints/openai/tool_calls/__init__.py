"""Tool calling: the model's tool-call formats parsed, and ``tool_choice`` as constraints."""
