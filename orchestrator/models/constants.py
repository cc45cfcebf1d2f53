"""Names shared by models and event consumers."""

TOOL_STREAMING_ARGS = "tool_streaming_args"
"""Key of a streaming tool-call event's ``function_call.args`` holding the latest argument delta."""
