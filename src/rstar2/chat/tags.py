"""The tags of the paper's format, spelled once: the policy answers inside ``<answer>``, calls the
tool inside ``<tool_call>`` and reads its output inside ``<tool_response>`` (and reasons inside
``<reason>``). The prompt's own wording (``prompt.py``) spells them in prose for the model."""

REASON_OPEN, REASON_CLOSE = "<reason>", "</reason>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

ALL = (
    REASON_OPEN,
    REASON_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
)
