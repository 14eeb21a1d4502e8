"""``octavo run-batch``: OpenAI Batch files run through the server's own app, in-process.

``lines`` reads input lines and builds output lines, ``output_file`` keeps the output
durable and resumable, ``runner`` sends the lines through the app, ``cli`` is the command.
"""
