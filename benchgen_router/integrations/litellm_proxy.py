"""The LiteLLM Proxy's response headers for the routing plugin's decision (docs/integrations/litellm.md).

A routing plugin can only report through `context.signals`, which LiteLLM keeps in the request's metadata
(`routing_plugin_signals`) and never sends to the client. This proxy callback reads them back after the call
and adds the gateway's x-benchgen-* headers to the answer, streamed or not:

    litellm_settings:
      callbacks: [benchgen_router.integrations.litellm_proxy.response_headers]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# First: importing it sets LiteLLM's offline price map before LiteLLM is imported.
from benchgen_router.integrations.litellm import SIGNALS_KEY, decision_headers

# isort: split
from litellm.integrations.custom_logger import CustomLogger


class ResponseHeaders(CustomLogger):
    """Adds x-benchgen-routed, x-benchgen-agent (and the setting decided under, or the reason LiteLLM's own
    choice stood) to every Proxy answer whose request the routing plugin saw."""

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        for key in ("metadata", "litellm_metadata"):
            metadata = data.get(key)
            signals = metadata.get("routing_plugin_signals") if isinstance(metadata, Mapping) else None
            decision = signals.get(SIGNALS_KEY) if isinstance(signals, Mapping) else None
            if isinstance(decision, Mapping):
                return decision_headers(decision)
        return None


response_headers = ResponseHeaders()
