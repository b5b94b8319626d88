"""An OpenAI-compatible server for formline (``formline serve``).

``POST /v1/chat/completions`` honours ``response_format`` (json_schema, json_object,
text), vLLM's ``structured_outputs`` and ``guided_*`` fields, ``tools`` with ``tool_choice``,
``stream``, ``n``, ``seed``, ``temperature``, ``top_p`` and ``max_tokens``; a field it
cannot honour is a 400 naming it. ``POST /v1/responses`` (the Responses API: ``input``,
``instructions``, ``text.format``, function ``tools``, ``stream``) maps onto the same
request and constraint (:mod:`.responses_requests`, :mod:`.responses_output`). Needs the
``server`` extra (FastAPI, uvicorn) for :mod:`.app`; the other modules import without it.
"""

from formline.server.requests import ChatRequest, Limits, parse_chat_request

__all__ = ["ChatRequest", "Limits", "parse_chat_request"]
