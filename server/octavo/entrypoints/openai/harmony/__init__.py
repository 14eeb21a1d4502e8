"""gpt-oss's Harmony format on the chat and Responses paths: prompts rendered by
``openai-harmony``'s encoding (``render.py``), replies read channel by channel
(``text_stream.py``) into reasoning, content and tool calls (``replies.py``)."""
