"""The model's building blocks; each runs a native kernel where one exists, else torch."""
