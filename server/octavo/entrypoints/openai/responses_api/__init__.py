"""The OpenAI Responses API (``/v1/responses``), served through the chat completion
pipeline: a request becomes a chat request (``conversion.py``), the engine's output
becomes Response objects (``objects.py``) or streamed events (``events.py``), and
responses are kept in a bounded in-memory store (``store.py``) for retrieval and
``previous_response_id`` chaining."""
