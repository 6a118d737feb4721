"""The OpenAI-compatible API: ``POST /v1/chat/completions`` (with tools, streaming) and ``GET /v1/models``.

One request is one assistant turn (``agent.completion``): the reasoning is selected by SSR and returned
as ``reasoning_content`` (the field SGLang and vLLM use), the action as ``tool_calls`` or ``content``.
Images arrive as ``image_url`` parts through the same safe intake as the agent endpoint; the request
takes an admission slot like every model route, and errors leave in OpenAI's shape (``api.errors``).

Split as vLLM splits its OpenAI server: ``protocol`` (the request models), ``conversation`` (request to
chat messages) and ``reply`` (the response objects), ``serving`` (the turn), ``router`` (the path
operations); each imports only those before it in that order.
"""
